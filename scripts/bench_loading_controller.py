#!/usr/bin/env python3
"""TTFT and chosen recompute ratio over storage read caps: --ratio auto vs a
fixed ratio (the table and plot of docs/BENCHMARKS.md).

For every read cap the chunk KV lives in a fresh chunk store on flash whose
reads are throttled to the cap (a fresh store, so that each cap is measured
by the controller from scratch rather than averaged with the previous one).
cb_bench fills the store, lets the controller calibrate with one untimed
auto request (its compute probe, and a first measurement of the store's
reads: until then it knows nothing about the store and uses r_min), then
times auto and the fixed ratio side by side (interleaved), both pipelined.
The selection policy is hkvd by default (--select): its loads overlap the
recompute, which is what the controller sizes r for; with lookahead the
loads end before the recompute starts and auto keeps the floor.

Writes DIR/loading_controller.jsonl (cb_bench's JSON lines, one per cap and
ratio setting), DIR/loading_controller.md (a Markdown table) and, when
gnuplot is installed, DIR/loading_controller.png.

  scripts/bench_loading_controller.py --cb-bench build/bin/cb_bench \\
      --caps 2000,500,100,25,10,5 --out-dir docs/bench
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def run_ttft(args, store, cap, ratios, repeat):
    cmd = [args.cb_bench, "ttft", "--chunks", str(args.chunks), "--chunk-tokens",
           str(args.chunk_tokens), "--modes", "blend", "--ratio", ratios, "--codec", args.codec,
           "--store", store, "--storage-mbps", str(cap), "--repeat", str(repeat), "--threads",
           str(args.threads), "--select", args.select, "--json"]
    if args.model:
        cmd += ["--model", args.model]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def plot(rows, fixed, png):
    if shutil.which("gnuplot") is None:
        print("gnuplot not found: no plot (apt-get install gnuplot-nox)", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "caps.dat")
        with open(data, "w") as f:
            f.write("# cap_mbps auto_ttft_s auto_ratio fixed_ttft_s load_s\n")
            for r in rows:
                f.write(f"{r['cap']} {r['auto']['ttft_ms'] / 1e3} {r['auto']['ratio']} "
                        f"{r['fixed']['ttft_ms'] / 1e3} {r['fixed']['load_ms'] / 1e3}\n")
        script = f"""
set terminal pngcairo size 900,540 font ",11"
set output "{png}"
set title "TTFT over storage read caps (blend, pipelined)"
set logscale x
set xrange [*:*] reverse
set xlabel "store read cap (MB/s)"
set ylabel "TTFT (s)"
set y2label "recompute ratio r"
set y2range [0:1.05]
set ytics nomirror
set y2tics 0.25
set key top left
set grid
plot "{data}" using 1:2 with linespoints lw 2 pt 7 title "TTFT, --ratio auto", \\
     "{data}" using 1:4 with linespoints lw 2 pt 5 title "TTFT, fixed r = {fixed}", \\
     "{data}" using 1:5 with lines dt 2 lw 1 title "load time (fixed r)", \\
     "{data}" using 1:3 axes x1y2 with linespoints lw 2 pt 9 title "r chosen by auto"
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cb-bench", default="build/bin/cb_bench")
    ap.add_argument("--model", default=None)
    ap.add_argument("--caps", default="2000,500,100,25,10,5", help="read caps, MB/s")
    ap.add_argument("--fixed", default="0.2",
                    help="the fixed ratio compared with auto (the default floor)")
    ap.add_argument("--select", default="hkvd", help="blend's selection policy")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--codec", default="q8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out-dir", default="docs/bench")
    ap.add_argument("--from-jsonl", nargs="+", metavar="FILE",
                    help="no runs: redraw the table and plot from earlier outputs (merged)")
    args = ap.parse_args()

    os.makedirs(args.out_dir, exist_ok=True)
    rows, lines = [], []
    if args.from_jsonl:
        for path in args.from_jsonl:
            with open(path) as f:
                lines += [json.loads(line) for line in f if line.strip()]
        for cap in sorted({r["storage_mbps"] for r in lines}, reverse=True):
            by = {r["ratio_mode"]: r for r in lines if r["storage_mbps"] == cap}
            rows.append({"cap": cap, "auto": by["auto"], "fixed": by["fixed"]})
    for cap in [] if args.from_jsonl else [float(c) for c in args.caps.split(",")]:
        cap_s = f"{cap:g}"
        with tempfile.TemporaryDirectory(prefix="cb-ctrl-") as store:
            print(f"cap {cap_s} MB/s: auto and r = {args.fixed}", file=sys.stderr)
            res = run_ttft(args, store, cap_s, f"auto,{args.fixed}", args.repeat)
        by = {r["ratio_mode"]: r for r in res}
        for r in res:
            r["storage_mbps"] = cap
            lines.append(r)
        rows.append({"cap": cap, "auto": by["auto"], "fixed": by["fixed"]})
        a, f = by["auto"], by["fixed"]
        print(f"  auto: r={a['ratio']:.2f} ttft={a['ttft_ms']:.0f} ms   fixed: "
              f"ttft={f['ttft_ms']:.0f} ms load={f['load_ms']:.0f} ms", file=sys.stderr)

    base = os.path.join(args.out_dir, "loading_controller")
    with open(base + ".jsonl", "w") as f:
        for r in lines:
            f.write(json.dumps(r) + "\n")
    with open(base + ".md", "w") as f:
        f.write(f"| read cap (MB/s) | auto: r | auto: TTFT (ms) | r = {args.fixed}: TTFT (ms) "
                f"| auto / fixed | load at r = {args.fixed} (ms) "
                f"| compute at r = {args.fixed} (ms) |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            a, x = r["auto"], r["fixed"]
            f.write(f"| {r['cap']:g} | {a['ratio']:.2f} | {a['ttft_ms']:.0f} | {x['ttft_ms']:.0f} "
                    f"| {a['ttft_ms'] / x['ttft_ms']:.2f} | {x['load_ms']:.0f} "
                    f"| {x['compute_ms']:.0f} |\n")
    plot(rows, args.fixed, base + ".png")
    print(open(base + ".md").read())


if __name__ == "__main__":
    main()
