#!/usr/bin/env python3
"""Writes a `cb_bench quality` dataset from a MuSiQue split.

MuSiQue (multi-hop questions over Wikipedia paragraphs, CC BY 4.0) is
published at https://github.com/StonyBrookNLP/musique; its data archive holds
JSON-lines splits such as musique_ans_v1.0_dev.jsonl, one question per line
with `question`, `answer`, `answer_aliases` and `paragraphs` (each with
`title` and `paragraph_text`).  The dataset written here is a JSON list of
{question, answers[], ctxs[{title, text}]}: the answer and its aliases, and
every paragraph in its given order (cb_bench quality --max-chunks K takes the
first K).  Unanswerable questions (answerable: false) are left out.

  scripts/musique_dataset.py musique_ans_v1.0_dev.jsonl musique_dev.json [--limit N]
  CB_DEV_DATA=musique_dev.json build/bin/cb_bench quality --limit 20 --max-chunks 4
"""
import argparse
import json
import sys


def convert(line, where):
    q = json.loads(line)
    try:
        if q.get("answerable", True) is False:
            return None
        return {
            "question": q["question"],
            "answers": [q["answer"]] + list(q.get("answer_aliases", [])),
            "ctxs": [{"title": p["title"], "text": p["paragraph_text"]} for p in q["paragraphs"]],
        }
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where}: not a MuSiQue question ({type(e).__name__}: {e})") from e


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("split", help="a MuSiQue JSON-lines split")
    ap.add_argument("out", help="the dataset to write (JSON)")
    ap.add_argument("--limit", type=int, default=0, help="keep the first N questions (0: all)")
    args = ap.parse_args()
    out = []
    try:
        with open(args.split, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                example = convert(line, f"{args.split}:{n}")
                if example:
                    out.append(example)
                if args.limit and len(out) >= args.limit:
                    break
    except (OSError, ValueError) as e:
        print(f"musique_dataset: error: {e}", file=sys.stderr)
        return 1
    if not out:
        print(f"musique_dataset: error: no answerable questions in {args.split}", file=sys.stderr)
        return 1
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    print(f"musique_dataset: {len(out)} questions written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
