#!/usr/bin/env python3
"""Answers of the RAG assistant per model, right or wrong, with their time to
first token: the evidence for the default model.

    scripts/eval_assistant.py --bin build/bin/rag_assistant --questions FILE.json
        --models models/A.gguf,models/B.gguf [--modes full,blend] [--threads 2]
        [--chunk-tokens N] [--top-k K] [--work DIR] [--json OUT.jsonl]

FILE.json: {"files": [paths, .gz read as text], "questions": [{"question": str,
"expect": [str...], "all": bool}]}: an answer is right when it contains one of
the `expect` strings (every one with "all": true), compared case-insensitively.
Relative file paths are taken from the question file's directory.  Each model
gets its own store under --work (default: a temporary directory): the files are
copied there (uncompressed), ingested once, then every question is asked in
every mode.  Prints a table per model and mode (right / asked, median and
worst TTFT) and, with --json, one object per answer.
"""
import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def read_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()


def corpus_name(path):
    # /usr/share/doc/zstd/README.md.gz -> zstd-README.md
    base = os.path.basename(path)
    if base.endswith(".gz"):
        base = base[:-3]
    if not base.endswith((".md", ".markdown", ".txt", ".text")):
        base += ".txt"
    return f"{os.path.basename(os.path.dirname(path))}-{base}"


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"eval_assistant: '{' '.join(cmd)}' failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def right(answer, q):
    a = answer.lower()
    hits = [e.lower() in a for e in q["expect"]]
    return all(hits) if q.get("all") else any(hits)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--modes", default="full,blend")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--chunk-tokens", default="")
    ap.add_argument("--top-k", default="")
    ap.add_argument("--max-tokens", default="48")
    ap.add_argument("--work", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    spec = json.load(open(a.questions))
    here = os.path.dirname(os.path.abspath(a.questions))
    files = [f if os.path.isabs(f) else os.path.join(here, f) for f in spec["files"]]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        sys.exit("eval_assistant: missing files: " + ", ".join(missing))
    work = a.work or tempfile.mkdtemp(prefix="cb-eval-")
    corpus = os.path.join(work, "corpus")
    os.makedirs(corpus, exist_ok=True)
    for f in files:
        with open(os.path.join(corpus, corpus_name(f)), "w", encoding="utf-8") as out:
            out.write(read_text(f))
    out = open(a.json, "w") if a.json else None
    modes = [m for m in a.modes.split(",") if m]
    rows = []
    for model in [m for m in a.models.split(",") if m]:
        store = os.path.join(work, "store-" + os.path.basename(model))
        base = [a.bin, "--model", model, "--threads", a.threads, "--store", store]
        ingest = base + ["ingest", corpus]
        if a.chunk_tokens:
            ingest += ["--chunk-tokens", a.chunk_tokens]
        t0 = time.time()
        run(ingest)
        ingest_s = time.time() - t0
        for mode in modes:
            ttft, ok = [], 0
            for q in spec["questions"]:
                cmd = base + ["ask", q["question"], "--mode", mode, "--json", "--max-tokens", a.max_tokens]
                if a.top_k:
                    cmd += ["--top-k", a.top_k]
                r = json.loads(run(cmd))
                good = right(r["answer"], q)
                ok += good
                ttft.append(r["ttft_ms"])
                print(f"  [{os.path.basename(model)} {mode}] {'RIGHT' if good else 'wrong'} "
                      f"{r['ttft_ms']:7.0f} ms  {q['question']}\n      -> {r['answer'].strip()[:160]!r}",
                      flush=True)
                if out:
                    out.write(json.dumps({"model": model, "mode": mode, "question": q["question"],
                                          "answer": r["answer"], "right": good, "ttft_ms": r["ttft_ms"],
                                          "n_ctx": r.get("n_ctx"), "sources": r.get("sources")}) + "\n")
            rows.append((os.path.basename(model), mode, ok, len(spec["questions"]),
                         statistics.median(ttft), max(ttft), ingest_s))
    print(f"\n{len(files)} files, {len(spec['questions'])} questions; threads {a.threads}\n")
    print("| model | mode | right | TTFT median ms | TTFT worst ms | ingest s |")
    print("|---|---|---:|---:|---:|---:|")
    for m, mode, ok, n, med, worst, ing in rows:
        print(f"| {m} | {mode} | {ok}/{n} | {med:.0f} | {worst:.0f} | {ing:.0f} |")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
