#!/usr/bin/env python3
"""Float64 NumPy reference forward pass of a Llama-family GGUF model (llama, qwen2, qwen3, gemma3).

An oracle for the C++ runtime: independent of it (weights dequantized by the
`gguf` package, every activation in float64, no quantized activations), simple
enough to check by reading.  For each prompt it writes the logits of the last
position.

    reference_forward.py --model M.gguf --prompts tests/golden/reference_prompts.json --out DIR

The prompts file holds {"prompts": [{"name": str, "ids": [int, ...]}, ...]}.
Writes DIR/<name>.logits.f64 (raw little-endian float64, n_vocab values),
DIR/manifest.json (n_vocab, model sha256, per prompt: n_tokens, argmax, top-5) and
DIR/prompts.txt (one line per prompt: "name id id ...", for C++ readers).  Results are cached under
${CB_CACHE_DIR:-~/.cache/cacheblend-rt}/reference/<key>, key = sha256 of
(model, this script, prompts file, numpy and gguf versions), so a re-run is a copy.

Model: hparams from the `<arch>.*` keys; per layer
    x += Wo · attn(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)    n = rmsnorm(x) · attn_norm
    x += Wdown · (silu(Wgate·n) * Wup·n)                           n = rmsnorm(x) · ffn_norm
logits = (output.weight or tied token_embd.weight) · (rmsnorm(x) · output_norm).
The biases are qwen2's (the others have none); qwen3 normalises each head of q
and k (rmsnorm, weights attn_q_norm / attn_k_norm) before RoPE.  RoPE rotates by
pos · base^(-2i/rot_dim) the pairs (x[2i], x[2i+1]) in llama files (the GGUF
converter permuted Wq/Wk for this layout) and the pairs (x[i], x[i + rot_dim/2])
in qwen2, qwen3 and gemma3 files (NEOX style).
Attention is causal and grouped: query head h reads KV head h // (n_head / n_head_kv).
gemma3 (as llama.cpp builds it): the embeddings are scaled by sqrt(n_embd); q and k
are normalised per head as in qwen3; the attention's and the feed-forward's outputs
are normalised (post_attention_norm, post_ffw_norm) before they are added; the gate
is GELU (tanh form) instead of silu; layers il with il % pattern != pattern - 1
(sliding_window_pattern, default 6) are local: a query sees only the last
sliding_window keys, and RoPE uses rope.freq_base_swa (default 10000) without
linear scaling (rope.scaling.type linear: positions divided by rope.scaling.factor,
on the global layers only).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Single-threaded BLAS: the matrices are small, and on a loaded 2-core machine
# BLAS worker threads spin and make the run 3x slower.  Set before numpy loads.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def gguf_version() -> str:
    from importlib.metadata import version
    return version("gguf")


def cache_root() -> Path:
    return Path(os.environ.get("CB_CACHE_DIR", Path.home() / ".cache" / "cacheblend-rt"))


def model_sha256(path: Path) -> str:
    """sha256 of the model file, memoized by (path, size, mtime) in the cache dir."""
    st = path.stat()
    memo = cache_root() / "sha256-memo.json"
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        table = json.loads(memo.read_text())
    except (OSError, ValueError):
        table = {}
    if key in table:
        return table[key]
    digest = sha256_file(path)
    table[key] = digest
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(memo)
    except OSError:
        pass
    return digest


class Model:
    def __init__(self, path: Path):
        self.reader = gguf.GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}
        arch = self.field("general.architecture")
        if arch not in ("llama", "qwen2", "qwen3", "gemma3"):
            raise SystemExit(f"reference_forward: architecture {arch!r} is not llama, qwen2, "
                             "qwen3 or gemma3")
        self.arch = arch
        self.neox = arch in ("qwen2", "qwen3", "gemma3")
        p = arch + "."
        self.n_layer = int(self.field(p + "block_count"))
        self.n_embd = int(self.field(p + "embedding_length"))
        self.n_ff = int(self.field(p + "feed_forward_length"))
        self.n_head = int(self.field(p + "attention.head_count"))
        self.n_head_kv = int(self.field(p + "attention.head_count_kv", self.n_head))
        self.head_dim = int(self.field(p + "attention.key_length", self.n_embd // self.n_head))
        vdim = int(self.field(p + "attention.value_length", self.head_dim))
        if vdim != self.head_dim:
            raise SystemExit("reference_forward: key_length != value_length is not supported")
        self.rope_base = float(self.field(p + "rope.freq_base", 10000.0))
        self.rot_dim = int(self.field(p + "rope.dimension_count", self.head_dim))
        self.eps = float(self.field(p + "attention.layer_norm_rms_epsilon"))
        scaling = self.field(p + "rope.scaling.type", "none")
        self.rope_pos_scale = 1.0
        if scaling == "linear":
            self.rope_pos_scale = 1.0 / float(self.field(p + "rope.scaling.factor", 1.0))
        elif scaling not in ("none", None):
            raise SystemExit(f"reference_forward: rope scaling {scaling!r} is not supported")
        self.window, self.pattern, self.rope_base_local = 0, 0, self.rope_base
        if arch == "gemma3":
            self.window = int(self.field(p + "attention.sliding_window", 0))
            self.pattern = int(self.field(p + "attention.sliding_window_pattern", 6))
            self.rope_base_local = float(self.field(p + "rope.freq_base_swa", 10000.0))
        if self.n_head % self.n_head_kv:
            raise SystemExit("reference_forward: head_count not a multiple of head_count_kv")
        emb = self.tensors["token_embd.weight"]
        self.n_vocab = int(emb.shape[1])  # gguf shape is [ne0=n_embd, ne1=n_vocab]

    def field(self, key: str, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            if default is None and not key.endswith(".rope.scaling.type"):
                raise SystemExit(f"reference_forward: GGUF key {key} missing")
            return default
        return f.contents()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def weight(self, name: str) -> np.ndarray:
        """Dequantized tensor as float64, numpy shape = reversed gguf shape
        (a matrix is (out_features, in_features): y = x @ W.T)."""
        t = self.tensors[name]
        w = dequantize(t.data, t.tensor_type)
        want = tuple(int(d) for d in reversed(t.shape))
        w = np.asarray(w, dtype=np.float64).reshape(want)
        return w

    def hparams(self) -> dict:
        return {k: getattr(self, k) for k in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv",
                                              "head_dim", "rot_dim", "rope_base", "eps", "n_vocab")}


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def is_local(m: Model, il: int) -> bool:
    return m.window > 0 and m.pattern > 0 and il % m.pattern != m.pattern - 1


def rope_tables(m: Model, n_pos: int, freq_factors: np.ndarray | None, base: float,
                pos_scale: float):
    i = np.arange(m.rot_dim // 2, dtype=np.float64)
    inv_freq = base ** (-2.0 * i / m.rot_dim)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors
    pos = np.arange(n_pos, dtype=np.float64) * pos_scale
    ang = np.outer(pos, inv_freq)  # (T, rot_dim/2)
    return np.cos(ang), np.sin(ang)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rot_dim: int,
         neox: bool = False) -> np.ndarray:
    """x: (T, heads, head_dim); rotate the pairs of the first rot_dim dims:
    adjacent (x[2i], x[2i+1]), or with neox (x[i], x[i + rot_dim/2])."""
    out = x.copy()
    if neox:
        i0, i1 = slice(0, rot_dim // 2), slice(rot_dim // 2, rot_dim)
    else:
        i0, i1 = slice(0, rot_dim, 2), slice(1, rot_dim, 2)
    x0 = x[..., i0]
    x1 = x[..., i1]
    c = cos[:, None, :]
    s = sin[:, None, :]
    out[..., i0] = x0 * c - x1 * s
    out[..., i1] = x0 * s + x1 * c
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_rep: int,
              window: int = 0) -> np.ndarray:
    """q: (T, H, D), k, v: (T, Hkv, D) -> (T, H*D); causal, grouped-query; with a
    window, query t sees keys t - window < s <= t."""
    T, H, D = q.shape
    k = np.repeat(k, n_rep, axis=1)  # head h -> kv head h // n_rep
    v = np.repeat(v, n_rep, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    if window > 0:
        mask |= np.tril(np.ones((T, T), dtype=bool), k=-window)
    scores[:, mask] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", p, v)
    return out.reshape(T, H * D)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(m: Model, prompts: list[list[int]], last_n: int = 1) -> list[np.ndarray]:
    """Runs all prompts layer by layer (each tensor dequantized once); returns
    each prompt's logits (float64) of its last position (n_vocab), or with
    last_n > 1 of its last last_n positions (last_n x n_vocab)."""
    emb = m.weight("token_embd.weight")  # (n_vocab, n_embd)
    for ids in prompts:
        if not ids or min(ids) < 0 or max(ids) >= m.n_vocab:
            raise SystemExit(f"reference_forward: token id out of range in {ids}")
    gemma = m.arch == "gemma3"
    scale = np.sqrt(m.n_embd) if gemma else 1.0
    xs = [emb[np.asarray(ids)] * scale for ids in prompts]
    freq_factors = m.weight("rope_freqs.weight") if m.has("rope_freqs.weight") else None
    n_pos = max(len(ids) for ids in prompts)
    # Linear RoPE scaling applies to the global layers only (Gemma 3).
    tables = {True: rope_tables(m, n_pos, freq_factors, m.rope_base_local, 1.0),
              False: rope_tables(m, n_pos, freq_factors, m.rope_base, m.rope_pos_scale)}
    act = gelu if gemma else silu
    H, Hkv, D = m.n_head, m.n_head_kv, m.head_dim
    for il in range(m.n_layer):
        b = f"blk.{il}."
        local = is_local(m, il)
        cos, sin = tables[local]
        window = m.window if local else 0
        post_attn = m.weight(b + "post_attention_norm.weight") if gemma else None
        post_ffn = m.weight(b + "post_ffw_norm.weight") if gemma else None
        attn_norm = m.weight(b + "attn_norm.weight")
        wq, wk, wv = m.weight(b + "attn_q.weight"), m.weight(b + "attn_k.weight"), m.weight(b + "attn_v.weight")
        wo = m.weight(b + "attn_output.weight")
        zero_q, zero_kv = np.zeros(H * D), np.zeros(Hkv * D)
        bq = m.weight(b + "attn_q.bias") if m.has(b + "attn_q.bias") else zero_q
        bk = m.weight(b + "attn_k.bias") if m.has(b + "attn_k.bias") else zero_kv
        bv = m.weight(b + "attn_v.bias") if m.has(b + "attn_v.bias") else zero_kv
        q_norm = m.weight(b + "attn_q_norm.weight") if m.has(b + "attn_q_norm.weight") else None
        k_norm = m.weight(b + "attn_k_norm.weight") if m.has(b + "attn_k_norm.weight") else None
        ffn_norm = m.weight(b + "ffn_norm.weight")
        wg, wu, wd = m.weight(b + "ffn_gate.weight"), m.weight(b + "ffn_up.weight"), m.weight(b + "ffn_down.weight")
        for i, x in enumerate(xs):
            T = x.shape[0]
            h = rmsnorm(x, attn_norm, m.eps)
            q = (h @ wq.T + bq).reshape(T, H, D)
            k = (h @ wk.T + bk).reshape(T, Hkv, D)
            v = (h @ wv.T + bv).reshape(T, Hkv, D)
            if q_norm is not None:
                q = rmsnorm(q, q_norm, m.eps)
            if k_norm is not None:
                k = rmsnorm(k, k_norm, m.eps)
            q = rope(q, cos[:T], sin[:T], m.rot_dim, m.neox)
            k = rope(k, cos[:T], sin[:T], m.rot_dim, m.neox)
            a_out = attention(q, k, v, H // Hkv, window) @ wo.T
            x = x + (rmsnorm(a_out, post_attn, m.eps) if gemma else a_out)
            h = rmsnorm(x, ffn_norm, m.eps)
            f_out = (act(h @ wg.T) * (h @ wu.T)) @ wd.T
            x = x + (rmsnorm(f_out, post_ffn, m.eps) if gemma else f_out)
            xs[i] = x
    out_norm = m.weight("output_norm.weight")
    w_out = m.weight("output.weight") if m.has("output.weight") else emb
    if last_n == 1:
        return [rmsnorm(x[-1], out_norm, m.eps) @ w_out.T for x in xs]
    return [rmsnorm(x[-last_n:], out_norm, m.eps) @ w_out.T for x in xs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--no-cache", action="store_true", help="ignore and do not fill the result cache")
    a = ap.parse_args()

    t0 = time.time()
    spec = json.loads(a.prompts.read_text())
    prompts = spec["prompts"]
    names = [p["name"] for p in prompts]
    if len(set(names)) != len(names) or not all(n.replace("_", "").replace("-", "").isalnum() for n in names):
        raise SystemExit("reference_forward: prompt names must be unique and [A-Za-z0-9_-]")

    msha = model_sha256(a.model)
    key = hashlib.sha256(
        f"{msha}|{sha256_file(Path(__file__))}|{sha256_file(a.prompts)}|{np.__version__}|{gguf_version()}"
        .encode()).hexdigest()[:24]
    cdir = cache_root() / "reference" / key
    files = [f"{n}.logits.f64" for n in names] + ["manifest.json", "prompts.txt"]

    if not a.no_cache and all((cdir / f).is_file() for f in files):
        source = "cache"
    else:
        m = Model(a.model)
        logits = forward(m, [p["ids"] for p in prompts])
        manifest = {
            "model": str(a.model.name),
            "model_sha256": msha,
            "script_sha256": sha256_file(Path(__file__)),
            "prompts_sha256": sha256_file(a.prompts),
            "n_vocab": m.n_vocab,
            "hparams": m.hparams(),
            "numpy": np.__version__,
            "gguf": gguf_version(),
            "format": "raw little-endian float64, last position, n_vocab values",
            "prompts": [],
        }
        (cache_root() / "reference").mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=cache_root() / "reference"))
        for p, lg in zip(prompts, logits):
            lg.astype("<f8").tofile(tmp / f"{p['name']}.logits.f64")
            top = np.argsort(-lg)[:5]
            manifest["prompts"].append({
                "name": p["name"], "n_tokens": len(p["ids"]), "file": f"{p['name']}.logits.f64",
                "argmax": int(top[0]), "top5": [int(t) for t in top],
                "top5_logits": [float(lg[t]) for t in top],
            })
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        # The same prompts for readers without a JSON parser: "name id id ..." per line.
        (tmp / "prompts.txt").write_text("".join(
            p["name"] + " " + " ".join(str(int(t)) for t in p["ids"]) + "\n" for p in prompts))
        if a.no_cache:
            cdir = tmp
        else:
            try:
                tmp.replace(cdir)  # atomic publish; a concurrent writer may have won
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        source = "computed"

    a.out.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(cdir / f, a.out / f)
    if a.no_cache and cdir != a.out:
        shutil.rmtree(cdir, ignore_errors=True)
    print(f"reference_forward: {len(prompts)} prompts -> {a.out} ({source}, {time.time() - t0:.1f}s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
