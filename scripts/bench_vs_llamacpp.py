#!/usr/bin/env python3
"""Side-by-side prefill/decode throughput: cb_bench vs llama.cpp's llama-bench.

Same GGUF, same thread count, runs interleaved (ours, peer, ours, peer, ...) so
that load on a shared machine hits both alike; the reported figure per side is
the median over rounds, and the ratio is ours / peer.

    scripts/bench_vs_llamacpp.py [--threads 2] [--rounds 3] [--prefill 512,2048] [--decode 128]

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
    ap.add_argument("--model", default=os.environ.get("CB_MODEL", os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")))
    args = ap.parse_args()

    cb = args.cb_bench
    peer = subprocess.run(["bash", os.path.join(ROOT, "scripts/build_llamacpp_peer.sh")], check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    peer_env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(peer))
    prefills = [int(x) for x in args.prefill.split(",") if x]
    ours = {}
    theirs = {}
    for _ in range(args.rounds):
        for n in prefills:
            r = run_json([cb, "prefill", "--tokens", str(n), "--repeat", "1", "--threads", str(args.threads),
                          "--model", args.model, "--json"])[-1]
            ours.setdefault(f"prefill {n}", []).append(r["tok_s"])
            p = run_json([peer, "-m", args.model, "-t", str(args.threads), "-p", str(n), "-n", "0", "-r", "1",
                          "-o", "jsonl"], env=peer_env)[-1]
            theirs.setdefault(f"prefill {n}", []).append(p["avg_ts"])
        r = run_json([cb, "decode", "--tokens", str(args.decode), "--threads", str(args.threads),
                      "--model", args.model, "--json"])[-1]
        ours.setdefault(f"decode {args.decode}", []).append(r["tok_s"])
        p = run_json([peer, "-m", args.model, "-t", str(args.threads), "-p", "0", "-n", str(args.decode), "-r", "1",
                      "-o", "jsonl"], env=peer_env)[-1]
        theirs.setdefault(f"decode {args.decode}", []).append(p["avg_ts"])

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()}; threads {args.threads}; "
          f"median of {args.rounds} interleaved rounds; model {os.path.basename(args.model)}\n")
    print("| test | cacheblend-rt tok/s | llama.cpp tok/s | ratio |")
    print("|---|---:|---:|---:|")
    for key in ours:
        a, b = statistics.median(ours[key]), statistics.median(theirs[key])
        print(f"| {key} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
