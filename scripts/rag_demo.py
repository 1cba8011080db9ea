#!/usr/bin/env python3
"""`make demo`: the RAG assistant on the bundled demo corpus.

  scripts/rag_demo.py --bin build/bin/rag_assistant --store build/rag_demo_store [--model M]

Ingests samples/rag_assistant/demo_corpus (a no-op when it is already in the
store), then asks each demo question twice, with CacheBlend (--mode blend)
and with a full prefill (--mode full), and prints both answers and their
time to first token side by side.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "samples", "rag_assistant", "demo_corpus")
# The demo corpus is a small company's internal handbook (on-call runbook,
# teams, offices, expenses, project pages, meeting notes: 8 Markdown files,
# about 3,500 tokens), chunked at the assistant's default length.  Each
# question's answer is in the corpus; the second needs two files (the
# project page names the owning team, the teams page its lead and office).
QUESTIONS = [
    ("SEV1 acknowledgement", "How quickly must the on-call engineer acknowledge a SEV1 page?"),
    ("Fleet Manager owner (2 files)",
     "Who leads the team that owns Fleet Manager, and which office do they work from?"),
    ("Hesai scanner decision",
     "What did the October architecture review decide about the Hesai XT16 scanner?"),
    ("meal allowance", "How much is the daily meal allowance for a work trip in Poland?"),
]


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"rag_demo: '{' '.join(cmd)}' failed (exit status {p.returncode})")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--threads", default="")
    a = ap.parse_args()
    base = [a.bin, "--store", a.store]
    if a.model:
        base += ["--model", a.model]
    if a.threads:
        base += ["--threads", a.threads]

    print(f"== ingest {os.path.relpath(CORPUS, ROOT)} into {a.store}", flush=True)
    print(run(base + ["ingest", CORPUS]).strip(), flush=True)

    rows = []
    for label, q in QUESTIONS:
        print(f"\n== {q}", flush=True)
        res = {}
        for mode in ("blend", "full"):
            res[mode] = json.loads(run(base + ["ask", q, "--mode", mode, "--json"]))
            print(f"  {mode:5}: {res[mode]['answer'].strip()}", flush=True)
        src = ", ".join(f"{s['file']} #{s['chunk']}" for s in res["blend"]["sources"])
        print(f"  sources (best first): {src}")
        rows.append((label, res["blend"], res["full"]))

    print("\nTime to first token (request start to first answer token; model loaded):")
    print(f"  {'question':30} {'tokens':>6} {'blend ms':>9} {'r':>5} {'hits/miss':>9} "
          f"{'full ms':>8} {'speed-up':>8}")
    for label, b, f in rows:
        print(f"  {label:30} {b['n_ctx']:6d} {b['ttft_ms']:9.1f} {b['ratio']:5.2f} "
              f"{b['cache_hits']:4d}/{b['cache_misses']:<4d} {f['ttft_ms']:8.1f} "
              f"{f['ttft_ms'] / b['ttft_ms']:7.2f}x")
    print(f"  ({rows[0][1]['threads']} threads; blend reuses each chunk's precomputed KV "
          f"and recomputes a fraction r of its tokens)")


if __name__ == "__main__":
    main()
