#!/usr/bin/env python3
"""CTest oracle_golden_fresh: the golden files must belong to the model in use.

    check_golden_fresh.py DEFAULT_MODEL tests/golden/llamacpp.json tests/golden/reference_prompts.json
                          [--fixed-model]

CB_MODEL in the environment overrides DEFAULT_MODEL, unless --fixed-model (goldens of a
second model, such as Gemma 3's).
Fails when llamacpp.json's meta.model_sha256 differs from MODEL's sha256 (a changed
model must not pass silently against stale goldens: run scripts/regen_goldens.sh),
or when a golden greedy prompt is missing from reference_prompts.json or has other
ids there (the prompts file may hold more prompts).
Standard library only.
"""
import hashlib
import json
import os
import sys


def main() -> int:
    model, golden_path, prompts_path = sys.argv[1:4]
    if "--fixed-model" not in sys.argv[4:]:
        model = os.environ.get("CB_MODEL") or model
    h = hashlib.sha256()
    with open(model, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    golden = json.load(open(golden_path, encoding="utf-8"))
    want = golden["meta"]["model_sha256"]
    if h.hexdigest() != want:
        print(f"oracle_golden_fresh: {model} has sha256 {h.hexdigest()},\n"
              f"  but {golden_path} was generated from {golden['meta'].get('model')} ({want}).\n"
              f"  Regenerate the goldens for this model: scripts/regen_goldens.sh", file=sys.stderr)
        return 1
    prompts = {p["name"]: p["ids"] for p in json.load(open(prompts_path, encoding="utf-8"))["prompts"]}
    greedy = {g["name"]: g["prompt_ids"] for g in golden["greedy"]}
    if any(prompts.get(name) != ids for name, ids in greedy.items()):
        print(f"oracle_golden_fresh: {prompts_path} does not match the greedy prompts of {golden_path}; "
              f"regenerate both with scripts/regen_goldens.sh", file=sys.stderr)
        return 1
    print(f"oracle_golden_fresh: goldens match {model} (sha256 {want[:16]}..., "
          f"{len(golden['tokenize'])} tokenize cases, {len(golden['greedy'])} greedy prompts, "
          f"llama-cpp-python {golden['meta'].get('llama_cpp_python')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
