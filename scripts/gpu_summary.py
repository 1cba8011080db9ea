#!/usr/bin/env python3
"""The GPU check's headline figures as two Markdown tables.

  gpu_summary.py RESULTS.jsonl

Reads the lines scripts/gpu_check.sh writes (cb_bench --json objects and
llama-bench -o jsonl objects, each tagged with its "step") and prints: prefill
and decode of this runtime beside llama.cpp on the same file and GPU (and the
CPU of the same machine), then the time to first token of each request mode,
with the buffers in device memory and in managed memory and with the tiled
attention kernel (CB_CUDA_ATTN=tiles), and the blend's share
of full prefill.  A figure the run lacks is "-".  Exit status 1 when the file
holds none of these figures (a run that measured nothing).
"""
import json
import sys


def load(path):
    """step -> the objects of that step, in file order."""
    steps = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            steps.setdefault(obj.get("step", ""), []).append(obj)
    return steps


def first(steps, step, **match):
    for obj in steps.get(step, []):
        if all(obj.get(k) == v for k, v in match.items()):
            return obj
    return None


def num(obj, key):
    v = obj.get(key) if obj else None
    return float(v) if isinstance(v, (int, float)) else None


def fmt(v, unit="", digits=1):
    return "-" if v is None else f"{v:,.{digits}f}{unit}"


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}x"


def peer_rate(steps, n_prompt, n_gen):
    obj = first(steps, "peer_gpu", n_prompt=n_prompt, n_gen=n_gen)
    return num(obj, "avg_ts")


def speed_rows(steps):
    rows, seen = [], 0
    for n, step, what in ((512, "gpu_prefill_512", "prefill 512"),
                          (2048, "gpu_prefill_2048", "prefill 2048"),
                          (8192, "gpu_prefill_8192", "prefill 8192"),
                          (8192, "gpu_prefill_8192_attn_tiles", "prefill 8192, tiled attention")):
        ours = first(steps, step)
        ms, tok_s = num(ours, "ms"), num(ours, "tok_s")
        peer = peer_rate(steps, n, 0)
        seen += ms is not None or peer is not None
        rows.append((what, f"{fmt(ms, ' ms')} ({fmt(tok_s, ' tok/s', 0)})",
                     fmt(peer, " tok/s", 0), ratio(tok_s, peer)))
    decode = num(first(steps, "gpu_decode"), "tok_s")
    peer = peer_rate(steps, 0, 128)
    cpu = num(first(steps, "cpu_decode"), "tok_s")
    seen += decode is not None or peer is not None
    rows.append(("decode 128", fmt(decode, " tok/s"), fmt(peer, " tok/s"), ratio(decode, peer)))
    for step, what in (("gpu_decode_issued", "decode, op by op"),
                       ("gpu_decode_managed", "decode, managed memory"),
                       ("gpu_decode_int8", "decode, int8 activations"),
                       ("gpu_decode_fused", "decode, fused GEMV"),
                       ("gpu_decode_fused_int8", "decode, fused GEMV, int8 activations"),
                       ("gpu_decode_split", "decode, keys split")):
        v = num(first(steps, step), "tok_s")
        rows.append((what, fmt(v, " tok/s"), "", ratio(v, peer)))
    # After a 4096-token prompt: beside llama.cpp's decode at that depth.
    deep = num(first(steps, "peer_gpu_depth", n_gen=128, n_depth=4096), "avg_ts")
    for i, (step, what) in enumerate((
            ("gpu_decode_ctx4096", "decode after 4096 tokens"),
            ("gpu_decode_ctx4096_split", "decode after 4096 tokens, keys split"),
            ("gpu_decode_ctx4096_all", "decode after 4096 tokens, every opt-in"))):
        v = num(first(steps, step), "tok_s")
        rows.append((what, fmt(v, " tok/s"), fmt(deep, " tok/s") if i == 0 else "",
                     ratio(v, deep)))
    rows.append(("decode, this machine's CPU", fmt(cpu, " tok/s"), "",
                 "GPU / CPU " + ratio(decode, cpu)))
    return rows, seen


def ttft_rows(steps):
    rows, seen = [], 0
    for step, what in (("gpu_ttft", "GPU, device memory"), ("gpu_ttft_managed", "GPU, managed memory"),
                       ("gpu_ttft_attn_tiles", "GPU, tiled attention"), ("cpu_ttft", "CPU")):
        ms = {m: num(first(steps, step, bench="ttft", mode=m), "ttft_ms")
              for m in ("full", "reuse", "blend")}
        seen += any(v is not None for v in ms.values())
        share = "-" if ms["blend"] is None or not ms["full"] else f"{ms['blend'] / ms['full']:.3f}"
        rows.append((what, fmt(ms["full"]), fmt(ms["reuse"]), fmt(ms["blend"]), share))
    return rows, seen


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        steps = load(argv[1])
    except OSError as e:
        print(f"gpu_summary: {e}", file=sys.stderr)
        return 1
    speed, n_speed = speed_rows(steps)
    ttft, n_ttft = ttft_rows(steps)
    if n_speed + n_ttft == 0:
        print(f"gpu_summary: no figures in {argv[1]}", file=sys.stderr)
        return 1
    print(table(("", "this runtime", "llama.cpp", "against llama.cpp"), speed))
    print()
    print(table(("ttft, ms", "full", "reuse", "blend", "blend / full"), ttft))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
