#!/usr/bin/env python3
"""Writes a small GGUF model of random weights, with the `gguf` package, and
prompts of random token ids for it: test inputs for architectures whose real
models are too large to ship (the float64 reference and the runtime then run
the same file).

    write_random_gguf.py --arch qwen2 --out DIR [--type q8_0] [--seed N]

`--type iq4_nl` has no quantizer in the `gguf` package; this script rounds
each block to the nearest of the type's 16 levels itself (what matters is
that the runtime and the reference read the same file).

`--arch llama3` writes a `llama` file with Llama 3.1's RoPE: base 500000 and
per-pair frequency divisors (rope_freqs.weight).  Writes DIR/<arch>.gguf and
DIR/<arch>.prompts.json ({"prompts": [{"name",
"ids"}]}, reference_forward.py's input).  The shapes are small but keep
what the architectures differ in: grouped-query attention (4 query heads on
2 KV heads), a head size that is not the embedding size's share (but for
qwen2, whose loader in llama.cpp takes the share), untied
output weights, for qwen2 the Q/K/V biases (drawn large enough to matter),
for qwen3 the per-head Q/K norms, and for both NEOX-style RoPE.  gemma3 adds
to qwen3's the embedding scale, the output norms of the attention and the
feed-forward, GELU, tied output weights, and a sliding window of 32 keys on
its local layers (two of every three) with their own RoPE base, and linear
RoPE scaling (factor 8) on the global layers, as Gemma 3 4B and larger.  The
tokenizer is byte-level BPE over the 256 byte symbols, four merges and three
ChatML control tokens.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import gguf

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_LAYER, N_CTX = 64, 4, 2, 24, 160, 3, 1024
MERGES = ["t h", "h e", "i n", "e r"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.float32)


def quantize_iq4_nl(x):
    """Rows of x as IQ4_NL blocks (f16 scale, 16 bytes of nibbles: element j
    low, j + 16 high): the element of largest magnitude maps to -127, the
    others to their nearest level."""
    n_out, n_in = x.shape
    blocks = x.reshape(-1, 32)
    peak = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
    d = (peak / -127.0).astype(np.float16)
    scaled = blocks / np.where(d == 0, 1, d.astype(np.float32))[:, None]
    q = np.abs(scaled[:, :, None] - IQ4_LEVELS[None, None, :]).argmin(axis=2).astype(np.uint8)
    nibbles = q[:, :16] | (q[:, 16:] << 4)
    raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), nibbles], axis=1)
    return raw.reshape(n_out, n_in // 32 * 18)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, choices=["llama", "llama3", "qwen2", "qwen3", "gemma3"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--type", default="q8_0",
                    choices=["f32", "f16", "q8_0", "q5_0", "q5_1", "iq4_nl"],
                    help="type of the weight matrices (default q8_0)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    tokens = byte_symbols() + [m.replace(" ", "") for m in MERGES] + SPECIAL
    n_vocab = len(tokens)
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0, "q5_0": gguf.GGMLQuantizationType.Q5_0,
             "q5_1": gguf.GGMLQuantizationType.Q5_1,
             "iq4_nl": gguf.GGMLQuantizationType.IQ4_NL}[a.type]

    global HEAD_DIM
    if a.arch == "qwen2":
        HEAD_DIM = N_EMBD // N_HEAD
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{a.arch}.gguf"
    arch = "llama" if a.arch == "llama3" else a.arch
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"random {a.arch}")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base({"llama3": 500000.0, "gemma3": 1000000.0}.get(a.arch, 10000.0))
    if a.arch == "gemma3":
        # As Gemma 3 4B and larger: linear RoPE scaling on the global layers.
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(8.0)
        w.add_sliding_window(32)
        w.add_uint32("gemma3.attention.sliding_window_pattern", 3)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre({"llama": "smollm", "llama3": "llama-bpe"}.get(a.arch, "qwen2"))
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (256 + len(MERGES)) +
                      [gguf.TokenType.CONTROL] * len(SPECIAL))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)

    def matrix(name, n_out, n_in):
        x = rng.standard_normal((n_out, n_in)).astype(np.float32) / np.sqrt(n_in)
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, x.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, x.astype(np.float16))
        elif qtype == gguf.GGMLQuantizationType.IQ4_NL:
            w.add_tensor(name, quantize_iq4_nl(x), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    def vector(name, n, mean, scale):
        w.add_tensor(name, (mean + scale * rng.standard_normal(n)).astype(np.float32))

    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    matrix("token_embd.weight", n_vocab, N_EMBD)
    for il in range(N_LAYER):
        b = f"blk.{il}."
        vector(b + "attn_norm.weight", N_EMBD, 1.0, 0.1)
        matrix(b + "attn_q.weight", q_dim, N_EMBD)
        matrix(b + "attn_k.weight", kv_dim, N_EMBD)
        matrix(b + "attn_v.weight", kv_dim, N_EMBD)
        if a.arch == "qwen2":
            vector(b + "attn_q.bias", q_dim, 0.0, 0.5)
            vector(b + "attn_k.bias", kv_dim, 0.0, 0.5)
            vector(b + "attn_v.bias", kv_dim, 0.0, 0.5)
        if a.arch in ("qwen3", "gemma3"):
            vector(b + "attn_q_norm.weight", HEAD_DIM, 1.0, 0.5)
            vector(b + "attn_k_norm.weight", HEAD_DIM, 1.0, 0.5)
        matrix(b + "attn_output.weight", N_EMBD, q_dim)
        vector(b + "ffn_norm.weight", N_EMBD, 1.0, 0.1)
        matrix(b + "ffn_gate.weight", N_FF, N_EMBD)
        matrix(b + "ffn_up.weight", N_FF, N_EMBD)
        matrix(b + "ffn_down.weight", N_EMBD, N_FF)
        if a.arch == "gemma3":
            vector(b + "post_attention_norm.weight", N_EMBD, 1.0, 0.3)
            vector(b + "post_ffw_norm.weight", N_EMBD, 1.0, 0.3)
    if a.arch == "llama3":
        # Divisors from 1 (the fastest pairs) to 8 (the slowest), as Llama 3.1's.
        w.add_tensor("rope_freqs.weight",
                     np.linspace(1.0, 8.0, HEAD_DIM // 2).astype(np.float32))
    vector("output_norm.weight", N_EMBD, 1.0, 0.1)
    if a.arch != "gemma3":
        matrix("output.weight", n_vocab, N_EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    prompts = [{"name": f"random_{n}", "ids": [int(t) for t in rng.integers(0, 256, n)]}
               for n in (1, 9, 77, 300)]
    (a.out / f"{a.arch}.prompts.json").write_text(json.dumps({"prompts": prompts}) + "\n")
    print(f"write_random_gguf: {path} ({a.type} matrices), {len(prompts)} prompts",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
