#!/usr/bin/env python3
"""Dumps llama.cpp's last-position logits for each prompt of a prompts file.

    llamacpp_logits.py --model M.gguf --prompts tests/golden/reference_prompts.json --out DIR [--kv f32|f16]
                       [--n-batch N]

Writes DIR/<name>.logits.f32 (raw little-endian float32, n_vocab values).  Used by
scripts/regen_goldens.sh with an F32 copy of the model and an F32 KV cache: then
llama.cpp computes without quantizing activations, and its logits must equal the
float64 reference's to float32 precision (compare_reference.py --max-rel-l2 1e-4).
--n-batch 1 evaluates a prompt one token at a time.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import llama_cpp


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--kv", choices=["f32", "f16"], default="f32")
    ap.add_argument("--n-batch", type=int, default=512)
    a = ap.parse_args()
    kv = llama_cpp.GGML_TYPE_F32 if a.kv == "f32" else llama_cpp.GGML_TYPE_F16
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=512, n_batch=a.n_batch, n_threads=2, n_threads_batch=2,
                          logits_all=True, flash_attn=False, type_k=kv, type_v=kv, verbose=False)
    a.out.mkdir(parents=True, exist_ok=True)
    prompts = json.loads(a.prompts.read_text())["prompts"]
    for p in prompts:
        llm.reset()
        llm.eval(p["ids"])
        np.asarray(llm.scores[llm.n_tokens - 1], dtype="<f4").tofile(a.out / f"{p['name']}.logits.f32")
    print(f"llamacpp_logits: {len(prompts)} prompts -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
