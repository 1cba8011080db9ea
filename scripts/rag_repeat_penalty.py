#!/usr/bin/env python3
"""How often rag_assistant's answers loop, and how often they are right, at
several repeat penalties.

  rag_repeat_penalty.py --bin build/bin/rag_assistant --store /tmp/rp_store
                        [--model models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf]
                        [--penalties 1.0,1.1,1.2] [--last-n 64] [--threads 2]
                        [--chunk-tokens 256] [--max-tokens 160] [--questions all|factual|open]

Ingests the demo corpus (samples/rag_assistant/demo_corpus) into --store,
then asks the four questions of scripts/rag_demo.py and a few more whose
answers are in the corpus (factual), and three that ask for a longer
answer (open), once per penalty (greedy, blend at the default
ratio).  An answer loops when a run of 8 words occurs twice in it (greedy
decoding that repeats itself repeats long runs verbatim); it is right when
it holds every expected fact.  Prints one line per answer, then a table:
penalty, loops, right, answers that hit --max-tokens, mean answer tokens.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "samples", "rag_assistant", "demo_corpus")

# (question, facts: each a tuple of accepted spellings, all facts needed)
QUESTIONS = [
    ("How quickly must the on-call engineer acknowledge a SEV1 page?",
     [("5 minutes", "five minutes", "5 min")]),
    ("Who leads the team that owns Fleet Manager, and which office do they work from?",
     [("Tomasz",), ("Gdansk", "Gdańsk")]),
    ("What did the October architecture review decide about the Hesai XT16 scanner?",
     [("experimental",)]),
    ("How much is the daily meal allowance for a work trip in Poland?", [("150",)]),
    ("What are the opening hours of the Gdansk office?", [("08:00", "8:00", "8 am", "8am"),
                                                          ("18:00", "6 pm", "6pm")]),
    ("How much memory do the laptops of engineers have?", [("32 GB", "32GB", "32 gigabytes")]),
    ("Which version of the LiDAR driver added support for the Hesai XT16?", [("3.4",)]),
]
# Questions that ask for a longer answer (a list, a description): where a
# small model's greedy answer falls into a loop.
OPEN_QUESTIONS = [
    ("Describe how the on-call rotation works.", [("primary",), ("secondary",)]),
    ("What happens during my first week at Brightwater Robotics?", [("laptop",)]),
    ("List the steps for handling an incident.", [("acknowledge",), ("#inc-", "channel")]),
    ("List every engineering team with its lead.",
     [("Tomasz",), ("Priya",), ("Lukas",), ("Chloe",), ("Daniel",)]),
    ("Summarize the decisions of the October architecture review.",
     [("zone",), ("experimental",), ("January", "retention")]),
    ("Explain the travel and expenses policy.", [("allowance",)]),
]

LOOP_WORDS = 8


def loops(text, n=LOOP_WORDS):
    words = text.split()
    seen = set()
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in seen:
            return True
        seen.add(gram)
    return False


def right(text, facts):
    t = text.lower()
    return all(any(s.lower() in t for s in spellings) for spellings in facts)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"rag_repeat_penalty: '{' '.join(cmd)}' failed (exit status {p.returncode})")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--penalties", default="1.0,1.1,1.2")
    ap.add_argument("--last-n", default="", help="--repeat-last-n (default: the app's)")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--chunk-tokens", default="256")
    ap.add_argument("--max-tokens", default="160")
    ap.add_argument("--questions", choices=["all", "factual", "open"], default="all")
    a = ap.parse_args()
    questions = {"all": QUESTIONS + OPEN_QUESTIONS, "factual": QUESTIONS,
                 "open": OPEN_QUESTIONS}[a.questions]
    base = [a.bin, "--store", a.store, "--threads", a.threads]
    if a.model:
        base += ["--model", a.model]
    run(base + ["ingest", CORPUS, "--chunk-tokens", a.chunk_tokens])
    rows = []
    for penalty in a.penalties.split(","):
        n_loop = n_right = n_capped = total_tokens = 0
        for q, facts in questions:
            cmd = base + ["ask", q, "--json", "--repeat-penalty", penalty,
                          "--max-tokens", a.max_tokens]
            if a.last_n:
                cmd += ["--repeat-last-n", a.last_n]
            r = json.loads(run(cmd))
            ans = r["answer"]
            lp, ok = loops(ans), right(ans, facts)
            capped = r["n_generated"] >= int(a.max_tokens)
            n_loop += lp
            n_right += ok
            n_capped += capped
            total_tokens += r["n_generated"]
            print(f"penalty {penalty} | loop {int(lp)} right {int(ok)} tokens "
                  f"{r['n_generated']:3} | {q}\n    {ans.strip()!r}", flush=True)
        rows.append((penalty, n_loop, n_right, n_capped, total_tokens / len(questions)))
    n = len(questions)
    print(f"\n| repeat penalty | answers that loop | right | hit --max-tokens | "
          f"mean answer tokens |")
    print("|---|---|---|---|---|")
    for penalty, n_loop, n_right, n_capped, mean in rows:
        print(f"| {penalty} | {n_loop}/{n} | {n_right}/{n} | {n_capped}/{n} | {mean:.0f} |")


if __name__ == "__main__":
    main()
