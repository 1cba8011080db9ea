#!/usr/bin/env python3
"""Side-by-side prefill/decode throughput: cb_bench vs llama.cpp's llama-bench.

Same GGUF, same thread count, runs interleaved (ours, peer, ours, peer, ...,
model after model within each round) so that load on a shared machine hits
both alike; the reported figure per side is the median over rounds, and the
ratio is ours / peer.  The load average before and after is printed with the
table.

    scripts/bench_vs_llamacpp.py [--threads 2] [--rounds 3] [--prefill 512,2048] [--decode 128]
                                 [--model M.gguf]... [--activations int8|f32]

--model may repeat (default: $CB_MODEL, else the Qwen2.5-Coder 1.5B and 0.5B
Instruct files and SmolLM2-135M, which `scripts/setup.sh model all` fetches
first when they are missing).

Needs build/bin/cb_bench (make build) and the peer (make peer, which builds
llama-bench from the llama-cpp-python sdist's sources into build/peer/).
Prints a Markdown table for docs/BENCHMARKS.md.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = ["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                  "SmolLM2-135M-Instruct.Q4_1.gguf"]


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip().startswith(("{", "["))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--cb-bench", default=os.path.join(ROOT, "build/bin/cb_bench"),
                    help="the cb_bench binary to measure (default: build/bin/cb_bench)")
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--activations", default="int8", choices=["int8", "f32"])
    args = ap.parse_args()
    models = args.model or ([os.environ["CB_MODEL"]] if os.environ.get("CB_MODEL") else [])
    if not models:
        # The default set, fetched when missing (idempotent; the 1.5B is not
        # part of the default set-up).
        subprocess.run(["bash", os.path.join(ROOT, "scripts/setup.sh"), "model", "all"], check=True)
        models = [os.path.join(ROOT, "models", f) for f in DEFAULT_MODELS]
    if not models:
        sys.exit("bench_vs_llamacpp: no model (scripts/setup.sh model, or --model)")

    cb = args.cb_bench
    peer = subprocess.run(["bash", os.path.join(ROOT, "scripts/build_llamacpp_peer.sh")], check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    peer_env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(peer))
    prefills = [int(x) for x in args.prefill.split(",") if x]
    ours = {}
    theirs = {}
    load_before = load_average()
    common = ["--threads", str(args.threads), "--activations", args.activations, "--json"]
    for _ in range(args.rounds):
        for model in models:
            for n in prefills:
                key = (model, f"prefill {n}")
                r = run_json([cb, "prefill", "--tokens", str(n), "--repeat", "1", "--model", model] + common)[-1]
                ours.setdefault(key, []).append(r["tok_s"])
                p = run_json([peer, "-m", model, "-t", str(args.threads), "-p", str(n), "-n", "0", "-r", "1",
                              "-o", "jsonl"], env=peer_env)[-1]
                theirs.setdefault(key, []).append(p["avg_ts"])
            key = (model, f"decode {args.decode}")
            r = run_json([cb, "decode", "--tokens", str(args.decode), "--model", model] + common)[-1]
            ours.setdefault(key, []).append(r["tok_s"])
            p = run_json([peer, "-m", model, "-t", str(args.threads), "-p", "0", "-n", str(args.decode), "-r", "1",
                          "-o", "jsonl"], env=peer_env)[-1]
            theirs.setdefault(key, []).append(p["avg_ts"])
    load_after = load_average()

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()}; threads {args.threads}; "
          f"median of {args.rounds} interleaved rounds; our activations {args.activations}; "
          f"load average {load_before} before, {load_after} after\n")
    print("| model | test | cacheblend-rt tok/s | llama.cpp tok/s | ratio |")
    print("|---|---|---:|---:|---:|")
    for (model, test) in ours:
        a, b = statistics.median(ours[(model, test)]), statistics.median(theirs[(model, test)])
        print(f"| {os.path.basename(model)} | {test} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
