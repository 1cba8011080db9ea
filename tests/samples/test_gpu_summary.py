#!/usr/bin/env python3
"""Test of scripts/gpu_summary.py (the GPU check's headline tables).

  test_gpu_summary.py [--root REPO]

No GPU: a results.jsonl written here as scripts/gpu_check.sh writes one
(cb_bench --json lines and llama-bench -o jsonl lines tagged with their step,
and lines that are not JSON).  Checks the figures and the ratios against
llama.cpp and the CPU, "-" for what the run lacks, and the exit status for a
run that measured nothing (1), an unreadable file (1) and a bad command line
(2).  Prints "N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from check_harness import check, describe, finish  # noqa: E402


def run(script, *args):
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def row(out, label):
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", ".."))
    script = os.path.join(ap.parse_args().root, "scripts", "gpu_summary.py")
    lines = [
        {"step": "gpu_prefill_512", "bench": "prefill", "ms": 40.0, "tok_s": 12800.0},
        {"step": "gpu_prefill_2048", "bench": "prefill", "ms": 160.0, "tok_s": 12800.0},
        {"step": "gpu_decode", "bench": "decode", "tok_s": 340.0},
        {"step": "gpu_decode_managed", "bench": "decode", "tok_s": 300.0},
        {"step": "gpu_decode_int8", "bench": "decode", "tok_s": 510.0},
        {"step": "gpu_decode_fused", "bench": "decode", "tok_s": 425.0},
        {"step": "gpu_decode_ctx4096_split", "bench": "decode", "tok_s": 212.5},
        {"step": "gpu_prefill_8192_attn_tiles", "bench": "prefill", "ms": 700.0, "tok_s": 11702.9},
        {"step": "cpu_decode", "bench": "decode", "tok_s": 68.0},
        {"step": "peer_gpu", "n_prompt": 512, "n_gen": 0, "avg_ts": 16000.0},
        {"step": "peer_gpu", "n_prompt": 2048, "n_gen": 0, "avg_ts": 6400.0},
        {"step": "peer_gpu", "n_prompt": 0, "n_gen": 128, "avg_ts": 425.0},
        {"step": "peer_gpu_depth", "n_prompt": 0, "n_gen": 128, "n_depth": 4096, "avg_ts": 250.0},
    ]
    for mode, ms in (("full", 344.0), ("reuse", 40.0), ("blend", 149.0)):
        lines.append({"step": "gpu_ttft", "bench": "ttft", "mode": mode, "ttft_ms": ms})
    lines.append({"step": "gpu_ttft_managed", "bench": "ttft", "mode": "full", "ttft_ms": 350.0})
    for mode, ms in (("full", 330.0), ("reuse", 40.0), ("blend", 110.0)):
        lines.append({"step": "gpu_ttft_attn_tiles", "bench": "ttft", "mode": mode, "ttft_ms": ms})
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "results.jsonl")
        with open(results, "w", encoding="utf-8") as f:
            f.write("=== a log line\n{not json\n")
            for obj in lines:
                f.write(json.dumps(obj) + "\n")
        rc, out, err = run(script, results)
        check(rc == 0, "a run's figures: exit status 0", describe(rc, out, err))
        r = row(out, "prefill 512")
        check(r == ["prefill 512", "40.0 ms (12,800 tok/s)", "16,000 tok/s", "0.80x"],
              "prefill beside llama.cpp's, the ratio of the rates", repr(r))
        r = row(out, "prefill 2048")
        check(r is not None and r[3] == "2.00x", "a faster prefill", repr(r))
        r = row(out, "prefill 8192")
        check(r == ["prefill 8192", "- (-)", "-", "-"], "absent lengths are -", repr(r))
        r = row(out, "prefill 8192, tiled attention")
        check(r == ["prefill 8192, tiled attention", "700.0 ms (11,703 tok/s)", "-", "-"],
              "prefill with the tiled attention", repr(r))
        r = row(out, "decode 128")
        check(r == ["decode 128", "340.0 tok/s", "425.0 tok/s", "0.80x"], "decode", repr(r))
        r = row(out, "decode, managed memory")
        check(r is not None and r[1] == "300.0 tok/s", "decode on managed memory", repr(r))
        r = row(out, "decode, int8 activations")
        check(r == ["decode, int8 activations", "510.0 tok/s", "", "1.20x"],
              "decode on int8 activations beside the peer", repr(r))
        r = row(out, "decode, fused GEMV")
        check(r == ["decode, fused GEMV", "425.0 tok/s", "", "1.00x"],
              "decode with the fused GEMV beside the peer", repr(r))
        r = row(out, "decode after 4096 tokens")
        check(r == ["decode after 4096 tokens", "-", "250.0 tok/s", "-"],
              "llama.cpp's decode at depth 4096 beside ours", repr(r))
        r = row(out, "decode after 4096 tokens, keys split")
        check(r == ["decode after 4096 tokens, keys split", "212.5 tok/s", "", "0.85x"],
              "decode after a long prompt with split keys", repr(r))
        r = row(out, "decode, op by op")
        check(r is not None and r[1] == "-" and r[3] == "-", "a missing variant", repr(r))
        r = row(out, "decode, this machine's CPU")
        check(r is not None and r[3] == "GPU / CPU 5.00x", "GPU against CPU", repr(r))
        r = row(out, "GPU, device memory")
        check(r == ["GPU, device memory", "344.0", "40.0", "149.0", "0.433"],
              "ttft per mode and the blend's share of full prefill", repr(r))
        r = row(out, "GPU, tiled attention")
        check(r == ["GPU, tiled attention", "330.0", "40.0", "110.0", "0.333"],
              "ttft with the tiled attention", repr(r))
        r = row(out, "GPU, managed memory")
        check(r == ["GPU, managed memory", "350.0", "-", "-", "-"], "a partial ttft row", repr(r))

        empty = os.path.join(tmp, "empty.jsonl")
        with open(empty, "w", encoding="utf-8") as f:
            f.write('{"step": "test_cuda_kernels"}\n')
        rc, out, err = run(script, empty)
        check(rc == 1 and "no figures" in err, "a run that measured nothing: status 1",
              describe(rc, out, err))
        rc, out, err = run(script, os.path.join(tmp, "missing.jsonl"))
        check(rc == 1 and "missing.jsonl" in err, "an unreadable file: status 1",
              describe(rc, out, err))
        rc, out, err = run(script)
        check(rc == 2 and "RESULTS.jsonl" in err, "no argument: usage, status 2",
              describe(rc, out, err))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
