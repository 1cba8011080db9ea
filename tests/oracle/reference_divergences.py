#!/usr/bin/env python3
"""Adds to a prompts file the points where llama.cpp's greedy continuation parts
from the float64 reference.

    reference_divergences.py --model M.gguf --golden tests/golden/llamacpp_gemma3.json
                             --prompts tests/golden/reference_prompts_gemma3.json

For each golden greedy prompt, the reference runs over the prompt and llama.cpp's
tokens (teacher-forced) and takes its argmax at every step; where it is not
llama.cpp's token, the prompt followed by llama.cpp's first N tokens is appended
to the prompts file as "<name>_at<N>".  The runtime's logits at those points are
then held to the reference's (the reference picks the token there), which shows
whose choice a divergence from llama.cpp is.  Prompts of an earlier run named
*_at* are replaced.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_json import dump  # noqa: E402
from reference_forward import Model, forward  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--golden", required=True, type=Path)
    ap.add_argument("--prompts", required=True, type=Path)
    a = ap.parse_args()
    golden = json.loads(a.golden.read_text())
    doc = json.loads(a.prompts.read_text())
    doc["prompts"] = [p for p in doc["prompts"] if "_at" not in p["name"]]
    m = Model(a.model)
    added = []
    for g in golden["greedy"]:
        ids = g["ids"]
        # Logits of the steps: after the prompt and after each of llama.cpp's tokens but the last.
        seq = g["prompt_ids"] + ids[:-1]
        logits = forward(m, [seq], last_n=len(ids))[0]
        for step, tok in enumerate(ids):
            if int(np.argmax(logits[step])) != tok:
                added.append({"name": f"{g['name']}_at{step}", "ids": g["prompt_ids"] + ids[:step]})
    doc["prompts"] += added
    note = " *_atN: the prompt and llama.cpp's first N tokens, where it parts from the reference."
    if note not in doc.get("comment", ""):
        doc["comment"] = doc.get("comment", "") + note
    a.prompts.write_text(dump(doc))
    print(f"reference_divergences: {len(added)} points where llama.cpp parts from the reference",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
