#!/usr/bin/env python3
"""What int8 activations cost in fidelity, next to what CacheBlend costs.

For RAG requests of a dataset (the format of `cb_bench quality`: a JSON list
of {question, answers[], ctxs[{title, text}]}, each ctx a chunk), runs full
prefill with int8 activations (the default) and with f32 activations, and
reuse and blend with each, and prints the first answer token's KL
divergence (nats) from the f32 full prefill's distribution: int8 full (the
noise floor of the int8 path), then reuse and blend at both precisions, and
how often int8 full keeps f32 full's top token.

    scripts/activation_fidelity.py --model M.gguf --dataset FILE [--limit 6] [--max-chunks 4]
                                   [--threads 2] [--library build/lib/libcacheblend.so.0]

Needs numpy (the oracle virtualenv has it: `scripts/oracle_venv.sh --print-python`).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log_softmax(logits):
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max()
    return x - math.log(np.exp(x).sum())


def kl(p, q):
    """KL(p || q) of two log-probability vectors."""
    return float((np.exp(p) * (p - q)).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--library", default=os.path.join(ROOT, "build/lib/libcacheblend.so.0"))
    a = ap.parse_args()
    os.environ.setdefault("CACHEBLEND_LIBRARY", a.library)
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
    import cacheblend as cb

    data = json.load(open(a.dataset))[: a.limit]
    model = cb.Model(a.model, n_threads=a.threads)
    rows = {k: [] for k in ("int8 full", "f32 reuse", "int8 reuse", "f32 blend", "int8 blend")}
    same_top1 = 0
    for ex in data:
        chunks = [c["title"] + "\n" + c["text"] for c in ex["ctxs"][: a.max_chunks]]
        out = {}
        for act in ("f32", "int8"):
            cache = cb.ChunkCache()
            for mode in ("FULL", "REUSE", "BLEND"):
                with model.session(n_ctx=8192, activations=act) as s:
                    s.rag_prefill(chunks, ex["question"], cache, cb.RagOptions(mode=mode))
                    out[(act, mode)] = log_softmax(s.logits())
        ref = out[("f32", "FULL")]
        rows["int8 full"].append(kl(ref, out[("int8", "FULL")]))
        for act in ("f32", "int8"):
            rows[f"{act} reuse"].append(kl(ref, out[(act, "REUSE")]))
            rows[f"{act} blend"].append(kl(ref, out[(act, "BLEND")]))
        same_top1 += int(out[("int8", "FULL")].argmax() == ref.argmax())
        print(f"  {ex['question'][:60]!r}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in rows.items()),
              flush=True)
    n = len(data)
    print(f"\n{os.path.basename(a.model)}: {n} requests of {a.max_chunks} chunks; first-token KL from "
          f"f32 full prefill (mean over requests)\n")
    print("| int8 full | f32 reuse | int8 reuse | f32 blend | int8 blend | int8 full keeps the top token |")
    print("|---:|---:|---:|---:|---:|---:|")
    m = {k: sum(v) / n for k, v in rows.items()}
    print(f"| {m['int8 full']:.4f} | {m['f32 reuse']:.4f} | {m['int8 reuse']:.4f} | {m['f32 blend']:.4f} | "
          f"{m['int8 blend']:.4f} | {same_top1}/{n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
