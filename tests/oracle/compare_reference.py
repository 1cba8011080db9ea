#!/usr/bin/env python3
"""Compares the float64 reference logits with llama.cpp's (validation of the oracle).

    compare_reference.py --reference DIR --llamacpp DIR [--golden tests/golden/llamacpp.json]

DIR (reference): output of reference_forward.py (<name>.logits.f64 + manifest.json).
DIR (llamacpp):  <name>.logits.f32 from llamacpp_golden.py --dump-logits.
Prints per prompt: relative L2 error ||ref - lcpp|| / ||ref||, max |diff|,
KL(softmax(ref) || softmax(lcpp)), the
argmax of both, and whether the reference's argmax equals llama.cpp's first greedy
token in the golden file.  Exits 1 if an argmax differs and is not a near-tie
(top-2 logit gap in the reference > 0.1), or if the relative L2 exceeds --max-rel-l2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True, type=Path)
    ap.add_argument("--llamacpp", required=True, type=Path)
    ap.add_argument("--golden", type=Path)
    ap.add_argument("--max-rel-l2", type=float, default=0.1)
    a = ap.parse_args()

    man = json.loads((a.reference / "manifest.json").read_text())
    first = {}
    if a.golden:
        for g in json.loads(a.golden.read_text())["greedy"]:
            first[g["name"]] = g["ids"][0]
    bad = 0
    rels, kls = [], []
    print(f"{'prompt':20s} {'n_tok':>5s} {'rel_L2':>9s} {'max|d|':>9s} {'KL':>8s} {'ref_top1':>8s} {'lcpp_top1':>9s} "
          f"{'golden':>7s} {'ref_gap':>7s}")
    for p in man["prompts"]:
        ref = np.fromfile(a.reference / p["file"], dtype="<f8")
        lc_path = a.llamacpp / f"{p['name']}.logits.f32"
        if not lc_path.exists():
            print(f"{p['name']:20s} (no llama.cpp logits)")
            continue
        lc = np.fromfile(lc_path, dtype="<f4").astype(np.float64)
        rel = float(np.linalg.norm(ref - lc) / np.linalg.norm(ref))
        rels.append(rel)
        mx = float(np.max(np.abs(ref - lc)))
        lp = ref - ref.max(); lp -= np.log(np.exp(lp).sum())
        lq = lc - lc.max(); lq -= np.log(np.exp(lq).sum())
        kl = float(np.sum(np.exp(lp) * (lp - lq)))
        kls.append(kl)
        r2 = np.argsort(-ref)[:2]
        gap = float(ref[r2[0]] - ref[r2[1]])
        lt = int(np.argmax(lc))
        g = first.get(p["name"], -1)
        ok = int(r2[0]) == lt and (g in (-1, lt))
        if not ok and gap > 0.1:
            bad += 1
        if rel > a.max_rel_l2:
            bad += 1
        print(f"{p['name']:20s} {p['n_tokens']:5d} {rel:9.2e} {mx:9.2e} {kl:8.1e} {int(r2[0]):8d} {lt:9d} "
              f"{g:7d} {gap:7.3f}{'' if ok else '  MISMATCH'}")
    if rels:
        print(f"relative L2: median {np.median(rels):.3e}, max {max(rels):.3e}; "
              f"KL(ref||llama.cpp): median {np.median(kls):.2e}, max {max(kls):.2e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
