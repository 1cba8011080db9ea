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
first when they are missing).  --prefill "" or --decode 0 leaves that test out.

With --dataset FILE (cb_bench quality's format, e.g. a MuSiQue dev split) it
also times RAG requests with their fidelity: per model, `cb_bench quality`
runs the first --limit requests (default 10) of at most --max-chunks passages
(default 4) as full prefill, reuse and blend at the default policy (one run
each, median over the requests; fidelity against full prefill of the same
request), and llama-bench times a full prefill of the requests' median length
(median of --rounds).  Prefill time does not depend on which tokens are read,
and it grows with their number, so that is llama.cpp's median over the same
requests.

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


def run_json(cmd, env=None, progress=False):
    """The JSON lines a command prints; with progress its stderr is shown as it runs."""
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                         stderr=None if progress else subprocess.PIPE, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip().startswith(("{", "["))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--cb-bench", default=os.path.join(ROOT, "build/bin/cb_bench"),
                    help="the cb_bench binary to measure (default: build/bin/cb_bench)")
    ap.add_argument("--peer", help="the llama-bench binary (default: the one scripts/build_llamacpp_peer.sh "
                    "builds, built first if missing)")
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--activations", default="int8", choices=["int8", "f32"])
    ap.add_argument("--dataset", help="also time RAG requests of this dataset, with their fidelity")
    ap.add_argument("--limit", type=int, default=10, help="requests of --dataset (default 10)")
    ap.add_argument("--max-chunks", type=int, default=4, help="passages per request (default 4)")
    args = ap.parse_args()
    if args.dataset and not os.path.isfile(args.dataset):
        sys.exit(f"bench_vs_llamacpp: no dataset at {args.dataset}")
    models = args.model or ([os.environ["CB_MODEL"]] if os.environ.get("CB_MODEL") else [])
    if not models:
        # The default set, fetched when missing (idempotent; the 1.5B is not
        # part of the default set-up).
        subprocess.run(["bash", os.path.join(ROOT, "scripts/setup.sh"), "model", "all"], check=True)
        models = [os.path.join(ROOT, "models", f) for f in DEFAULT_MODELS]
    if not models:
        sys.exit("bench_vs_llamacpp: no model (scripts/setup.sh model, or --model)")

    cb = args.cb_bench
    peer = args.peer or subprocess.run(["bash", os.path.join(ROOT, "scripts/build_llamacpp_peer.sh")],
                                       check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
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
            if args.decode <= 0:
                continue
            key = (model, f"decode {args.decode}")
            r = run_json([cb, "decode", "--tokens", str(args.decode), "--model", model] + common)[-1]
            ours.setdefault(key, []).append(r["tok_s"])
            p = run_json([peer, "-m", model, "-t", str(args.threads), "-p", "0", "-n", str(args.decode), "-r", "1",
                          "-o", "jsonl"], env=peer_env)[-1]
            theirs.setdefault(key, []).append(p["avg_ts"])
    rag = {model: rag_requests(args, cb, peer, peer_env, model) for model in models} if args.dataset else {}
    load_after = load_average()

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()}; threads {args.threads}; "
          f"median of {args.rounds} interleaved rounds; our activations {args.activations}; "
          f"load average {load_before} before, {load_after} after")
    if ours:
        print("\n| model | test | cacheblend-rt tok/s | llama.cpp tok/s | ratio |")
        print("|---|---|---:|---:|---:|")
    for (model, test) in ours:
        a, b = statistics.median(ours[(model, test)]), statistics.median(theirs[(model, test)])
        print(f"| {os.path.basename(model)} | {test} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    if rag:
        print_rag_table(args, rag)
    return 0


def rag_requests(args, cb, peer, peer_env, model):
    """One model's RAG requests: cb_bench quality's full, reuse and blend lines,
    and llama.cpp's full prefill of the median request length (ms, median)."""
    print(f"bench_vs_llamacpp: {args.limit} requests of {os.path.basename(args.dataset)} on "
          f"{os.path.basename(model)} (cb_bench quality)...", file=sys.stderr, flush=True)
    lines = run_json([cb, "quality", "--dataset", args.dataset, "--limit", str(args.limit),
                      "--max-chunks", str(args.max_chunks), "--modes", "full,reuse,blend",
                      "--model", model, "--threads", str(args.threads),
                      "--activations", args.activations, "--json"], progress=True)
    by_mode = {line["mode"]: line for line in lines if line.get("bench") == "quality"}
    n = int(round(by_mode["full"]["request_tokens_median"]))
    peer_ms = []
    for _ in range(args.rounds):
        p = run_json([peer, "-m", model, "-t", str(args.threads), "-p", str(n), "-n", "0", "-r", "1",
                      "-o", "jsonl"], env=peer_env)[-1]
        peer_ms.append(1000.0 * n / p["avg_ts"])
    return {"modes": by_mode, "tokens": n, "peer_full_ms": statistics.median(peer_ms)}


def print_rag_table(args, rag):
    first = next(iter(rag.values()))["modes"]["full"]
    print(f"\nRAG requests: the first {first['n']} of {os.path.basename(args.dataset)}, at most "
          f"{args.max_chunks} passages each; ours one run per request and mode (median over the "
          f"requests), llama.cpp a full prefill of the median request length (median of "
          f"{args.rounds}); blend at the default policy; fidelity against full prefill of the "
          f"same request, teacher-forced over {first['tf_tokens']} tokens.\n")
    print("| model | tokens (median) | llama.cpp full, ms | ours full, ms (speed-up) | reuse, ms | "
          "blend, ms (of ours full, of llama.cpp's) | computed | gap closed (first / tf) | top-1 tf | "
          "full prefill's answer |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for model, r in rag.items():
        full, reuse, blend = (r["modes"][m] for m in ("full", "reuse", "blend"))
        peer_ms, ours_ms, blend_ms = r["peer_full_ms"], full["ttft_ms_median"], blend["ttft_ms_median"]
        print(f"| {os.path.basename(model)} | {r['tokens']} | {peer_ms:,.0f} | {ours_ms:,.0f} "
              f"({peer_ms / ours_ms:.2f}x) | {reuse['ttft_ms_median']:,.0f} | {blend_ms:,.0f} "
              f"({blend_ms / ours_ms:.2f}, {blend_ms / peer_ms:.2f}) | {blend['computed_fraction']:.3f} | "
              f"{blend['gap_closed']:.2f} / {blend['gap_closed_tf']:.2f} | {blend['top1_tf']:.3f} | "
              f"{round(blend['exact_answer'] * blend['n'])} of {blend['n']} |")


if __name__ == "__main__":
    sys.exit(main())
