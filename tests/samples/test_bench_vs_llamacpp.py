#!/usr/bin/env python3
"""Test of scripts/bench_vs_llamacpp.py's RAG table (--dataset), with stand-ins.

  test_bench_vs_llamacpp.py [--root REPO]

No model and no benchmark runs: a stand-in cb_bench prints quality lines of
known figures and a stand-in llama-bench a known prefill speed, each logging
its arguments.  Checks that the quality run gets the requests, passages and
modes asked for, that llama-bench times the median request length, that every
figure of the table row is the one the stand-ins imply (llama.cpp's ms from
its tokens per second, the speed-up and the blend's shares), and that a
missing dataset is an error before anything runs.  Prints "N passed, N
failed"; exit status 1 on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from check_harness import check, describe, finish  # noqa: E402

QUALITY = {
    "full": {"ttft_ms_median": 8000.0, "computed_fraction": 1.0, "gap_closed": 1.0, "gap_closed_tf": 1.0,
             "top1_tf": 1.0, "exact_answer": 1.0},
    "reuse": {"ttft_ms_median": 400.0, "computed_fraction": 0.02, "gap_closed": 0.0, "gap_closed_tf": 0.0,
              "top1_tf": 0.9, "exact_answer": 0.5},
    "blend": {"ttft_ms_median": 2000.0, "computed_fraction": 0.231, "gap_closed": 0.884,
              "gap_closed_tf": 0.861, "top1_tf": 0.978, "exact_answer": 0.9},
}

STAND_IN_BENCH = """#!/usr/bin/env python3
import json, sys
with open(sys.argv[0] + ".log", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
for mode, fields in json.loads({quality!r}).items():
    print(json.dumps(dict(bench="quality", mode=mode, n=10, tf_tokens=32,
                          request_tokens_median=2207.5, **fields)))
"""

STAND_IN_PEER = """#!/usr/bin/env python3
import json, sys
with open(sys.argv[0] + ".log", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
print("log line the script must skip")
print(json.dumps({"avg_ts": 100.0}))
"""


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    args = ap.parse_args()
    script = os.path.join(args.root, "scripts", "bench_vs_llamacpp.py")
    with tempfile.TemporaryDirectory() as tmp:
        bench, peer = os.path.join(tmp, "cb_bench"), os.path.join(tmp, "llama-bench")
        write_exe(bench, STAND_IN_BENCH.format(quality=json.dumps(QUALITY)))
        write_exe(peer, STAND_IN_PEER)
        data = os.path.join(tmp, "dev.json")
        with open(data, "w") as f:
            json.dump([], f)
        cmd = [sys.executable, script, "--cb-bench", bench, "--peer", peer, "--model", "m.gguf",
               "--prefill", "", "--decode", "0", "--rounds", "3", "--dataset", data, "--limit", "10",
               "--max-chunks", "4"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        check(p.returncode == 0, "--dataset: exit status 0", describe(p.returncode, p.stdout, p.stderr))
        with open(bench + ".log") as f:
            runs = f.read().splitlines()
        check(len(runs) == 1 and runs[0].startswith("quality ") and "--dataset " + data in runs[0]
              and "--limit 10" in runs[0] and "--max-chunks 4" in runs[0]
              and "--modes full,reuse,blend" in runs[0] and "--json" in runs[0],
              "one quality run of the requests asked for (no prefill or decode run)", str(runs))
        with open(peer + ".log") as f:
            peer_runs = f.read().splitlines()
        check(len(peer_runs) == 3 and all("-p 2208 -n 0" in r for r in peer_runs),
              "llama-bench: a full prefill of the median request length, once per round", str(peer_runs))
        # llama.cpp: 2208 tokens at 100 tok/s = 22,080 ms; ours 8,000 ms (2.76x);
        # blend 2,000 ms = 0.25 of ours and 0.09 of llama.cpp's.
        row = "| m.gguf | 2208 | 22,080 | 8,000 (2.76x) | 400 | 2,000 (0.25, 0.09) | 0.231 | 0.88 / 0.86 | 0.978 | 9 of 10 |"
        check(row in p.stdout, "the table row's figures", p.stdout[-1500:])
        check("| ratio |" not in p.stdout and "\n\n\n" not in p.stdout,
              "no throughput table (nor its blank line) when no test was asked for", p.stdout)

        p = subprocess.run(cmd[:-6] + ["--dataset", os.path.join(tmp, "absent.json")],
                           capture_output=True, text=True)
        with open(bench + ".log") as f:
            runs_after = f.read().splitlines()
        check(p.returncode != 0 and "no dataset at" in p.stderr and runs_after == runs,
              "a missing dataset is an error before anything runs",
              describe(p.returncode, p.stdout, p.stderr))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
