#!/usr/bin/env python3
"""Answers of the RAG assistant per model, right or wrong, with their time to
first token: the evidence for the default model.

    scripts/eval_assistant.py --bin build/bin/rag_assistant --questions FILE.json
        --models models/A.gguf,models/B.gguf [--modes full,blend] [--threads 2]
        [--chunk-tokens N] [--top-k K] [--work DIR] [--json OUT.jsonl] [--neighbours]
        [--shift-off]
    scripts/eval_assistant.py ... --dataset DEV.json [--limit N] (instead of --questions)

FILE.json: {"files": [paths, .gz read as text], "questions": [{"question": str,
"expect": [str...], "all": bool}]}: an answer is right when it contains one of
the `expect` strings (every one with "all": true), compared case-insensitively.
Relative file paths are taken from the question file's directory.  --dataset
takes a `cb_bench quality` dataset instead (a JSON list of {question, answers[],
ctxs[{title, text}]}): the first --limit questions, every ctx of theirs one
file of the corpus (all questions share the store, as an app's documents do),
an answer right when it contains one of `answers`.  Each model gets its own
store under --work (default: a temporary directory): the files are copied
there (uncompressed), ingested once, then every question is asked in every
mode.  With --neighbours the store's chunks also get their KV computed after
their nearest chunk (ingest --kv-neighbours on, timed apart), and every mode
but full runs again with it ("blend+neighbours").  Prints a table per model
and mode (right / asked; with full among the modes, how many answers are
full prefill's and their word-overlap F1 against it; median and worst TTFT;
the ingest's seconds, for the +neighbours rows those of computing the
neighbours' KV) and, with --json, one object per answer.  With --shift-off
every mode but full runs again without the chunk shift ("blend-shift-off"),
so that the library's default and the method without it answer side by side.
"""
import argparse
import collections
import gzip
import json
import os
import re
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


def answer_f1(answer, reference):
    """Word-overlap F1 of an answer against another (full prefill's): how
    much of the same answer a mode gives, in finer steps than equality."""
    a = re.findall(r"\w+", answer.lower())
    b = re.findall(r"\w+", reference.lower())
    common = sum((collections.Counter(a) & collections.Counter(b)).values())
    if common == 0:
        return float(a == b)
    p, r = common / len(a), common / len(b)
    return 2 * p * r / (p + r)


def right(answer, q):
    a = answer.lower()
    hits = [e.lower() in a for e in q["expect"]]
    return all(hits) if q.get("all") else any(hits)


def dataset_spec(path, limit, work):
    """A questions spec (and its corpus files under work/dataset) from a
    cb_bench quality dataset."""
    examples = json.load(open(path))[:limit]
    folder = os.path.join(work, "dataset")
    os.makedirs(folder, exist_ok=True)
    files, seen = [], {}
    for ex in examples:
        for c in ex["ctxs"]:
            text = f"# {c['title']}\n\n{c['text']}\n"
            if text in seen:
                continue
            seen[text] = os.path.join(folder, f"ctx{len(seen):04d}.md")
            with open(seen[text], "w", encoding="utf-8") as f:
                f.write(text)
            files.append(seen[text])
    questions = [{"question": ex["question"], "expect": ex["answers"]} for ex in examples]
    return {"files": files, "questions": questions}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--questions", default="")
    ap.add_argument("--dataset", default="")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--neighbours", action="store_true")
    ap.add_argument("--shift-off", action="store_true")
    ap.add_argument("--models", required=True)
    ap.add_argument("--modes", default="full,blend")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--chunk-tokens", default="")
    ap.add_argument("--top-k", default="")
    ap.add_argument("--max-tokens", default="48")
    ap.add_argument("--work", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    if bool(a.questions) == bool(a.dataset):
        sys.exit("eval_assistant: give --questions or --dataset")
    work = a.work or tempfile.mkdtemp(prefix="cb-eval-")
    if a.dataset:
        spec = dataset_spec(a.dataset, a.limit, work)
        here = work
    else:
        spec = json.load(open(a.questions))
        here = os.path.dirname(os.path.abspath(a.questions))
    files = [f if os.path.isabs(f) else os.path.join(here, f) for f in spec["files"]]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        sys.exit("eval_assistant: missing files: " + ", ".join(missing))
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
        run(ingest + ["--kv-neighbours", "off"])
        ingest_s = time.time() - t0
        runs = [(mode, False, False) for mode in modes]
        if a.shift_off:
            runs += [(mode, False, True) for mode in modes if mode != "full"]
        if a.neighbours:
            runs += [(mode, True, False) for mode in modes if mode != "full"]
        full_answers = {}
        for i, (mode, neighbours, shift_off) in enumerate(runs):
            if neighbours and not runs[i - 1][1]:
                # The neighbours' KV, once, before the first mode that uses it.
                t0 = time.time()
                run(ingest + ["--kv-neighbours", "on"])
                ingest_s = time.time() - t0
            name = mode + ("+neighbours" if neighbours else "") + ("-shift-off" if shift_off else "")
            ttft, ok, same, f1 = [], 0, 0, 0.0
            for q in spec["questions"]:
                cmd = base + ["ask", q["question"], "--mode", mode, "--json", "--max-tokens", a.max_tokens]
                if a.top_k:
                    cmd += ["--top-k", a.top_k]
                if shift_off:
                    cmd += ["--chunk-shift", "off"]
                r = json.loads(run(cmd))
                good = right(r["answer"], q)
                ok += good
                if mode == "full":
                    full_answers[q["question"]] = r["answer"]
                if q["question"] in full_answers:
                    same += full_answers[q["question"]] == r["answer"]
                    f1 += answer_f1(r["answer"], full_answers[q["question"]])
                ttft.append(r["ttft_ms"])
                print(f"  [{os.path.basename(model)} {name}] {'RIGHT' if good else 'wrong'} "
                      f"{r['ttft_ms']:7.0f} ms  {q['question']}\n      -> {r['answer'].strip()[:160]!r}",
                      flush=True)
                if out:
                    out.write(json.dumps({"model": model, "mode": name, "question": q["question"],
                                          "answer": r["answer"], "right": good, "ttft_ms": r["ttft_ms"],
                                          "computed_fraction": r.get("computed_fraction"),
                                          "n_ctx": r.get("n_ctx"),
                                          "sources": [f"{s['file']}#{s['chunk']}" for s in r["sources"]]})
                              + "\n")
            n = len(spec["questions"])
            rows.append((os.path.basename(model), name, ok, (same, f1 / n) if full_answers else None,
                         n, statistics.median(ttft), max(ttft), ingest_s))
    print(f"\n{len(files)} files, {len(spec['questions'])} questions; threads {a.threads}\n")
    print("| model | mode | right | full prefill's answer | F1 to full prefill's | TTFT median ms "
          "| TTFT worst ms | ingest s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for m, mode, ok, vs_full, n, med, worst, ing in rows:
        same_text, f1_text = ("", "") if vs_full is None else (f"{vs_full[0]}/{n}", f"{vs_full[1]:.3f}")
        print(f"| {m} | {mode} | {ok}/{n} | {same_text} | {f1_text} | {med:.0f} | {worst:.0f} "
              f"| {ing:.0f} |")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
