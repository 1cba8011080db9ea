"""The generated regions of docs/BENCHMARKS.md: for each, the benchmark
outputs it reads from the bench directory and the Markdown it writes
(tables, the commands that produced them, plot links).  Used by
write_benchmarks_md.py, which finds the regions in the doc and replaces them.
"""
import glob
import json
import os
import re
import sys

PROG = "write_benchmarks_md"
# Blend's default recompute ratio (cb_bench's --ratio default).
DEFAULT_RATIO = 0.2


class Missing(Exception):
    """An input file of a region is not there: the region is left as it was."""


class BadInput(Exception):
    """An input file is there but cannot be used."""




# ---------------------------------------------------------------------------
# Formatting


def fnum(x, digits):
    return "-" if x is None else f"{x:.{digits}f}"


def fms(x):
    """Milliseconds: whole ms from 100 up, one decimal below."""
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}"


def fratio(x):
    return fnum(x, 3)


def fg(x):
    """A setting such as a read cap or a ratio: shortest exact form."""
    return "-" if x is None else f"{x:g}"


def table(headers, rows, right=()):
    """A Markdown table; columns whose index is in `right` are right-aligned."""
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def duration(seconds):
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


# ---------------------------------------------------------------------------
# Inputs


class Context:
    def __init__(self, bench_dir, doc_path):
        self.dir = bench_dir
        self.doc_dir = os.path.dirname(os.path.abspath(doc_path))
        self.runs = self._read_runs()

    def path(self, name):
        return os.path.join(self.dir, name)

    def need(self, name):
        p = self.path(name)
        if not os.path.isfile(p):
            raise Missing(p)
        return p

    def text(self, name):
        p = self.need(name)
        try:
            with open(p, encoding="utf-8") as f:
                t = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"{p}: {e}")
        if not t.strip():
            raise BadInput(f"{p} is empty (did its run fail?)")
        return t

    def jsonl(self, name):
        """cb_bench --json output: one object per line (other lines ignored)."""
        p = self.need(name)
        rows = []
        for i, line in enumerate(self.text(name).splitlines(), 1):
            if not line.lstrip().startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise BadInput(f"{p}:{i}: not JSON: {e}")
        if not rows:
            raise BadInput(f"{p} has no JSON lines")
        return rows

    def rel(self, name):
        """Path of a bench file relative to the doc, for links."""
        return os.path.relpath(self.path(name), self.doc_dir).replace(os.sep, "/")

    def link(self, name):
        return f"[`{self.rel(name)}`]({self.rel(name)})"

    def plot(self, name, alt):
        if not os.path.isfile(self.path(name)):
            print(f"{PROG}: no plot {self.path(name)} (gnuplot missing?): not linked",
                  file=sys.stderr)
            return ""
        return f"![{alt}]({self.rel(name)})"

    def _read_runs(self):
        """DIR/runs.tsv: file, start (UTC), commit, seconds, command; the last
        line for a file wins."""
        runs = {}
        p = self.path("runs.tsv")
        if not os.path.isfile(p):
            return runs
        with open(p, encoding="utf-8") as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 5:
                    continue
                file, start, commit, secs, cmd = parts
                try:
                    secs = float(secs)
                except ValueError:
                    secs = None
                runs[file] = {"start": start, "commit": commit, "seconds": secs, "command": cmd}
        return runs

    def provenance(self, files):
        """The commands that produced `files` (names in DIR), when and at what
        commit, as recorded in runs.tsv."""
        seen, cmds, starts, commits, total = set(), [], [], [], 0.0
        unknown = []
        for f in files:
            r = self.runs.get(f)
            if r is None:
                unknown.append(f)
                continue
            if r["command"] in seen:
                continue
            seen.add(r["command"])
            cmds.append(r["command"])
            starts.append(r["start"])
            if r["commit"] not in commits:
                commits.append(r["commit"])
            total += r["seconds"] or 0.0
        out = []
        if cmds:
            when = min(starts) if len(set(starts)) == 1 else f"{min(starts)} to {max(starts)}"
            out.append(f"Produced by (run of {when}, commit {', '.join(commits)}, "
                       f"{duration(total)}):")
            out.append("")
            out.append("```")
            out.extend(cmds)
            out.append("```")
        if unknown:
            if out:
                out.append("")
            out.append("Command not recorded for " +
                       ", ".join(f"`{u}`" for u in unknown) + " (no line in runs.tsv).")
        return "\n".join(out)


def only(rows, **match):
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


# ---------------------------------------------------------------------------
# Regions


MACHINE_LABELS = [
    ("date", "run started"), ("finished", "run finished"), ("cpu", "CPU"), ("cores", "cores"),
    ("cpu flags", "CPU flags"), ("memory", "memory"), ("kernel", "kernel"),
    ("load average", "load average at start (1, 5, 15 min)"),
    ("load average at end", "load average at end"), ("commit", "commit"), ("tree", "work tree"),
    ("build", "build"), ("threads", "threads"), ("model", "model"), ("sections", "sections run"),
]


def parse_machine(text):
    fields = {}
    for line in text.splitlines():
        if ": " not in line:
            continue
        k, v = line.split(": ", 1)
        # Older machine.txt: "threads: 2; quick: 0; build: build".
        for part in ([f"{k}: {v}"] if k != "threads" else f"{k}: {v}".split("; ")):
            if ": " in part:
                kk, vv = part.split(": ", 1)
                fields[kk.strip()] = vv.strip()
    return fields


def region_machine(ctx):
    m = parse_machine(ctx.text("machine.txt"))
    known = {k for k, _ in MACHINE_LABELS} | {"quick"}
    rows = [(label, m[k]) for k, label in MACHINE_LABELS if m.get(k)]
    rows += [(k, v) for k, v in m.items() if k not in known and v]
    out = []
    if m.get("quick", "0") not in ("0", "no", ""):
        out.append("**Quick run (`--quick`): every size shrunk; these are not the documented "
                   "figures.**")
        out.append("")
    out.append(table(["machine and run", ""], rows))
    out.append("")
    out.append(f"From {ctx.link('machine.txt')}.")
    if ctx.runs:
        by_run = {}
        for f, r in sorted(ctx.runs.items()):
            by_run.setdefault((r["start"], r["commit"]), []).append(f)
        if len(by_run) > 1:
            out.append("")
            out.append("The outputs come from several runs (a partial `--only` run redoes "
                       "only its own sections):")
            out.append("")
            for (start, commit), files in sorted(by_run.items()):
                out.append(f"* {start}, commit {commit}: " + ", ".join(f"`{f}`" for f in files))
    return "\n".join(out)


def sizes_from(pattern):
    def key(path):
        m = re.search(r"_(\d+)\.json$", path)
        return int(m.group(1)) if m else 0
    return sorted(glob.glob(pattern), key=key)


def region_speed(ctx):
    prefills = sizes_from(ctx.path("prefill_*.json"))
    decodes = sizes_from(ctx.path("decode_*.json"))
    if not prefills:
        raise Missing(ctx.path("prefill_*.json"))
    if not decodes:
        raise Missing(ctx.path("decode_*.json"))
    rows, files, first = [], [], None
    for p in prefills + decodes:
        name = os.path.basename(p)
        files.append(name)
        r = ctx.jsonl(name)[-1]
        first = first or r
        if r.get("bench") == "prefill":
            rows.append((f"prefill {r['n_tokens']}", fnum(r["tok_s"], 1), fms(r["ms"]),
                         fnum(r.get("tok_s_best"), 1), r.get("repeat", 1)))
        else:
            runs = r.get("tok_s_runs") or [r["tok_s"]]
            rows.append((f"decode {r['n_tokens']} (context {r.get('ctx', '-')})",
                         fnum(r["tok_s"], 1), f"{r['ms_per_token']:.2f} per token",
                         fnum(max(runs), 1), r.get("repeat", 1)))
    # The file's name too: a GGUF's own name field may not say its quantization.
    model = first.get("model_name", first.get("model"))
    if first.get("model_name") and first.get("model"):
        model += f" (`{os.path.basename(first['model'])}`)"
    out = [f"cacheblend-rt alone: {model}, "
           f"{first.get('kernels', '?')} kernels, {first['threads']} threads, median of "
           f"the rounds (one process per size).",
           "",
           table(["test", "tok/s (median)", "ms (median)", "tok/s (best)", "rounds"], rows,
                 right=(1, 2, 3, 4)),
           "",
           ctx.provenance(files)]
    return "\n".join(out)


def region_vs_llamacpp(ctx):
    body = ctx.text("vs_llamacpp.md").strip()
    if "| ratio |" not in body:
        raise BadInput(f"{ctx.path('vs_llamacpp.md')} has no table")
    return "\n".join([body, "", "ratio = cacheblend-rt / llama.cpp (above 1: ours is faster).",
                      "", ctx.provenance(["vs_llamacpp.md"])])


def ttft_setup(r):
    head = r.get("chunk_head", "?")
    where = "chunk KV in RAM" if r.get("codec") in (None, "f32") else \
        f"chunk KV in a store on flash ({r['codec']})"
    return (f"{r['chunks']} chunks x {r['chunk_tokens']} tokens + a {r['query_tokens']}-token "
            f"question = {r['n_ctx']}-token requests; {where}; chunk head {head}; "
            f"{r['threads']} threads; median of {r.get('repeat', 1)}.")


def ratio_label(r):
    return ("auto: " if r.get("ratio_mode") == "auto" else "") + fnum(r["ratio"], 2)


def region_ttft(ctx):
    rows = ctx.jsonl("ttft.jsonl")
    out = [ttft_setup(rows[0]), ""]
    t = []
    for r in rows:
        t.append((r["mode"], ratio_label(r), fms(r["ttft_ms"]), fms(r["compute_ms"]),
                  fms(r["load_ms"]), fms(r["blocked_ms"]), fratio(r["computed_fraction"]),
                  f"{r['cache_hits']}/{r['cache_misses']}", fratio(r.get("ttft_vs_full"))))
    out.append(table(["mode", "r", "TTFT (ms)", "compute (ms)", "load (ms)", "blocked (ms)",
                      "computed", "hits/misses", "TTFT / full"], t,
                     right=(2, 3, 4, 5, 6, 8)))
    notes = []
    b = [r for r in only(rows, mode="blend") if abs(r["ratio"] - DEFAULT_RATIO) < 1e-6]
    if b and b[0].get("ttft_vs_full") is not None:
        notes.append(f"blend at r = {DEFAULT_RATIO} (the default): "
                     f"**{b[0]['ttft_vs_full']:.3f}x** full prefill's TTFT "
                     f"for {b[0]['computed_fraction']:.3f} of its row work")
    for mode in ("reuse", "prefix"):
        m = only(rows, mode=mode)
        if m and m[0].get("ttft_vs_full") is not None:
            notes.append(f"{mode}: **{m[0]['ttft_vs_full']:.3f}x**")
    if notes:
        out += ["", "In this run: " + "; ".join(notes) + "."]
    out += ["", "`computed`: the fraction of full prefill's per-layer row work the mode did; "
            "TTFT / full: side by side in the same process."]
    plot = ctx.plot("ttft_ratio.png", "TTFT per mode and ratio")
    out += ["", ctx.provenance(["ttft.jsonl"])]
    if plot:
        out += ["", plot]
    return "\n".join(out)


def region_ttft_caps(ctx):
    rows = ctx.jsonl("ttft_caps.jsonl")
    caps = sorted({r["storage_mbps"] for r in rows if r.get("storage_mbps") is not None},
                  reverse=True)
    if not caps:
        raise BadInput(f"{ctx.path('ttft_caps.jsonl')} has no storage_mbps")
    first = rows[0]
    fixed = sorted({r["ratio"] for r in only(rows, mode="blend", ratio_mode="fixed")})
    out = [f"{first['chunks']} chunks x {first['chunk_tokens']} tokens + a "
           f"{first['query_tokens']}-token question = {first['n_ctx']}-token requests; chunk "
           f"KV in a store on flash ({first.get('codec')}) whose reads are throttled to the "
           f"cap; {first['threads']} threads; median of {first.get('repeat', 1)}.  Cells: "
           f"TTFT in ms (x full prefill's at the same cap).", ""]

    def cell(r):
        if r is None:
            return "-"
        vs = r.get("ttft_vs_full")
        return fms(r["ttft_ms"]) + (f" ({vs:.2f}x)" if vs is not None else "")

    headers = ["read cap (MB/s)", "full", "reuse"] + [f"blend r = {fg(x)}" for x in fixed] + \
              ["blend auto", "auto: r", "MB read"]
    t = []
    for cap in caps:
        at = [r for r in rows if r.get("storage_mbps") == cap]
        full = only(at, mode="full")
        reuse = only(at, mode="reuse")
        auto = only(at, mode="blend", ratio_mode="auto")
        line = [fg(cap), cell(full[0] if full else None), cell(reuse[0] if reuse else None)]
        for x in fixed:
            b = [r for r in only(at, mode="blend", ratio_mode="fixed") if r["ratio"] == x]
            line.append(cell(b[0] if b else None))
        line.append(cell(auto[0] if auto else None))
        line.append(fnum(auto[0]["ratio"], 2) if auto else "-")
        read = max((r.get("bytes_read") or 0) for r in at)
        line.append(f"{read / 1e6:.1f}")
        t.append(line)
    out.append(table(headers, t, right=tuple(range(1, len(headers)))))
    plot = ctx.plot("ttft_caps.png", "TTFT per read cap")
    out += ["", ctx.provenance(["ttft_caps.jsonl"])]
    if plot:
        out += ["", plot]
    return "\n".join(out)


def gap_closed(r):
    """Gap closed on the first token / over the teacher-forced answer: 1 is full
    prefill's distribution, 0 plain reuse's (outputs older than the measure: -)."""
    first, tf = r.get("gap_closed"), r.get("gap_closed_tf")
    if first is None and tf is None:
        return "-"
    return f"{fnum(first, 2)} / {fnum(tf, 2)}"


def quality_table(rows, labels=None, vs_full=False):
    full = only(rows, mode="full")
    full_ms = full[0]["ttft_ms_median"] if full else None
    headers = ["mode", "r", "n", "F1", "fidelity F1", "top-1 agree", "KL(first)",
               "gap closed (first / tf)", "top-1 tf", "TTFT median (ms)"] + \
        (["TTFT / full"] if vs_full else []) + ["computed"]
    t = []
    for i, r in enumerate(rows):
        line = [labels[i] if labels else r["mode"], ratio_label(r), r["n"], fnum(r["f1"], 3),
                fnum(r["fidelity_f1"], 3), fnum(r["top1_agree"], 2), fnum(r["kl_first"], 4),
                gap_closed(r), fnum(r.get("top1_tf"), 3), fms(r["ttft_ms_median"])]
        if vs_full:
            line.append(fratio(r["ttft_ms_median"] / full_ms) if full_ms else "-")
        line.append(fratio(r["computed_fraction"]))
        t.append(line)
    return table(headers, t, right=tuple(range(2, len(headers))))


def quality_setup(r, where=None, head=None):
    chunks = f"at most {r['max_chunks']}" if r.get("max_chunks") else "all"
    if where is None:
        where = "chunk KV in RAM" if r.get("codec") in (None, "f32") else \
            f"chunk KV in a store on flash ({r['codec']})"
    head = head or f"chunk head {r.get('chunk_head', '?')}"
    n = f"{r['n']} question" + ("" if r["n"] == 1 else "s")
    return (f"{n} of `{os.path.basename(r.get('dataset', '?'))}`, {chunks} "
            f"passages each as chunks; greedy answers of at most {r.get('max_tokens', '?')} "
            f"tokens; {where}; {head}; {r['threads']} threads.")


def region_quality(ctx):
    rows = ctx.jsonl("quality.jsonl")
    out = [quality_setup(rows[0]), "", quality_table(rows, vs_full=True), "",
           "`computed`: fraction of full prefill's per-layer row work; TTFT on runs with "
           "every chunk already cached; fidelity F1, top-1 agree, KL(first), gap closed and "
           "top-1 tf compare with full prefill of the same prompt (gap closed: the share of "
           "plain reuse's KL from full prefill that the mode removes, on the first token and "
           "over full prefill's answer fed token by token; top-1 tf: how often the top token "
           "agrees over that answer)."]
    plot = ctx.plot("quality.png", "answer quality per mode")
    out += ["", ctx.provenance(["quality.jsonl"])]
    if plot:
        out += ["", plot]
    return "\n".join(out)


def region_chunk_head(ctx):
    rows, labels, files = [], [], []
    for head in ("prompt", "none"):
        name = f"chunk_head_{head}.jsonl"
        ctx.need(name)
        files.append(name)
    for name, head in zip(files, ("prompt", "none")):
        for r in ctx.jsonl(name):
            rows.append(r)
            labels.append(f"{r['mode']} (head {head})")
    return "\n".join([quality_setup(rows[0], head="chunk head as in each row"),
                      "", quality_table(rows, labels), "", ctx.provenance(files)])


def region_codecs(ctx):
    rows, labels, files = [], [], []
    for codec in ("f16", "q8", "q4"):
        ctx.need(f"codec_{codec}.jsonl")
    for codec in ("f16", "q8", "q4"):
        name = f"codec_{codec}.jsonl"
        files.append(name)
        for r in ctx.jsonl(name):
            rows.append(r)
            labels.append(f"{r['mode']} (codec {codec})")
    # The same questions with the chunk KV in RAM (f32): §5's blend row.
    ram = []
    if os.path.isfile(ctx.path("chunk_head_prompt.jsonl")):
        try:
            ram = [r for r in only(ctx.jsonl("chunk_head_prompt.jsonl"), mode="blend")
                   if r["n"] == rows[0]["n"] and r["ratio"] == rows[0]["ratio"]]
        except BadInput:
            ram = []
    if ram:
        rows.insert(0, ram[0])
        labels.insert(0, "blend (RAM, f32)")
    setup = quality_setup(rows[-1], where="chunk KV in a store on flash, written with "
                          "each row's codec")
    out = [setup, "", quality_table(rows, labels)]
    if ram:
        out += ["", "`blend (RAM, f32)` is the `blend (head prompt)` row of §5: the same "
                "questions with the chunk KV in RAM, the reference for the codecs."]
    out += ["", ctx.provenance(files)]
    return "\n".join(out)


CODEC_ROW = re.compile(r"^(f16|q8|q4)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                       r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
FETCH_ROW = re.compile(r"^(f16|q8|q4)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$")
CHUNK_LINE = re.compile(r"^chunk (\d+) layers x (\d+) tokens x kv_dim (\d+); "
                        r"f16 = (\d+) bytes/token")


def region_codec_sizes(ctx):
    text = ctx.text("codec_sizes.txt")
    sizes, fetch, shape = [], [], None
    for line in text.splitlines():
        if CHUNK_LINE.match(line):
            shape = CHUNK_LINE.match(line).groups()
        elif CODEC_ROW.match(line):
            sizes.append(CODEC_ROW.match(line).groups())
        elif FETCH_ROW.match(line):
            fetch.append(FETCH_ROW.match(line).groups())
    if not sizes:
        raise BadInput(f"{ctx.path('codec_sizes.txt')}: no codec table "
                       "(did test_cache's CodecBench run?)")
    out = []
    if shape:
        out += [f"One chunk of SmolLM2-135M's shape ({shape[0]} layers x {shape[1]} tokens x "
                f"kv_dim {shape[2]}; f16 = {int(shape[3]):,} bytes/token), synthetic KV-like "
                "data; one thread, best of 5 (1 for zstd >= 9).  GB/s count the f16-equivalent "
                "bytes; errors are relative to the data's rms.", ""]
    out.append(table(["codec", "zstd level", "bytes/token", "vs f16", "encode GB/s",
                      "decode GB/s", "max abs error", "rel. rms error K", "rel. rms error V"],
                     [(c, z, f"{float(b):,.0f}", v, e, d, mx, k, vv)
                      for c, z, b, v, e, d, mx, k, vv in sizes], right=tuple(range(1, 9))))
    if fetch:
        out += ["", "The whole fetch path from a warm page cache (pread, checksum, decode; one "
                "chunk, one thread, best of 5):", "",
                table(["codec", "zstd level", "ms per chunk", "GB/s (f16-equivalent)"],
                      fetch, right=(1, 2, 3))]
    out += ["", ctx.provenance(["codec_sizes.txt"])]
    return "\n".join(out)


PIPE_HEAD = re.compile(r"n_tokens (\d+)\s+bytes/request ([\d.]+) MB\s+uncapped: compute "
                       r"(\d+) ms, load (\d+) ms -> cap ([\d.]+) MB/s")
PIPE_ROW = re.compile(r"^(serial|pipelined)\s+fusion\s+([\d.]+) ms \(rag_prefill\s+([\d.]+)\)"
                      r"\s+load\s+([\d.]+) \(fetch\s+([\d.]+)\)\s+compute\s+([\d.]+)\s+blocked"
                      r"\s+([\d.]+)\s+max\(load,compute\)\s+([\d.]+)\s+ratio fusion/max "
                      r"([\d.]+)")


def region_pipeline(ctx):
    text = ctx.text("pipeline.txt")
    head = PIPE_HEAD.search(text)
    runs, serial = [], None
    for line in text.splitlines():
        m = PIPE_ROW.match(line.strip())
        if not m:
            continue
        kind = m.group(1)
        vals = [float(x) for x in m.groups()[1:]]
        if kind == "serial":
            serial = vals
        elif serial is not None:
            runs.append((serial, vals))
            serial = None
    if not runs:
        raise BadInput(f"{ctx.path('pipeline.txt')}: no serial/pipelined lines "
                       "(did PipelineBench run?)")
    out = []
    if head:
        n, mb, comp, load, cap = head.groups()
        out += [f"{n}-token requests (8 chunks x 512 tokens + 32 query tokens), q8 store, "
                f"{mb} MB read per request, r = 0.15; uncapped, compute {comp} ms and load "
                f"{load} ms, so the read cap is set to **{cap} MB/s** (load ~ compute).", ""]
    t = []
    for i, (s, p) in enumerate(runs, 1):
        t.append((i, fms(s[0]), fms(p[0]), f"{p[0] / s[0]:.2f}", fms(p[2]), fms(p[4]),
                  fms(p[6]), f"{p[7]:.2f}"))
    out.append(table(["run", "serial fusion (ms)", "pipelined (ms)", "pipelined / serial",
                      "load (ms)", "compute (ms)", "max(load, compute) (ms)",
                      "pipelined / max"], t, right=tuple(range(1, 8))))
    out += ["", "load, compute: of the pipelined run; pipelined / max = 1 is perfect overlap.",
            "", ctx.provenance(["pipeline.txt"])]
    return "\n".join(out)


def region_controller(ctx):
    rows = ctx.jsonl("loading_controller.jsonl")
    caps = sorted({r["storage_mbps"] for r in rows if r.get("storage_mbps") is not None},
                  reverse=True)
    t, fixed_r, first_fixed = [], None, None
    for cap in caps:
        at = [r for r in rows if r.get("storage_mbps") == cap]
        a = only(at, ratio_mode="auto")
        x = only(at, ratio_mode="fixed")
        if not a or not x:
            continue
        a, x = a[0], x[0]
        fixed_r = x["ratio"]
        first_fixed = first_fixed or x
        t.append((fg(cap), fnum(a["ratio"], 2), fms(a["ttft_ms"]), fms(x["ttft_ms"]),
                  f"{a['ttft_ms'] / x['ttft_ms']:.2f}", fms(x["load_ms"]), fms(x["compute_ms"])))
    if not t:
        raise BadInput(f"{ctx.path('loading_controller.jsonl')}: no cap with both auto and "
                       "fixed rows")
    r0 = first_fixed
    out = [f"{r0['chunks']} chunks x {r0['chunk_tokens']} tokens, {r0['n_ctx']}-token "
           f"requests, {r0['bytes_read'] / 1e6:.1f} MB of stored KV ({r0.get('codec')}) read "
           f"per request; {r0['threads']} threads; auto and r = {fg(fixed_r)} interleaved, "
           f"median of {r0.get('repeat', 1)}, both pipelined.", "",
           table(["read cap (MB/s)", "auto: r", "auto: TTFT (ms)",
                  f"r = {fg(fixed_r)}: TTFT (ms)", "auto / fixed",
                  f"load at r = {fg(fixed_r)} (ms)", f"compute at r = {fg(fixed_r)} (ms)"], t,
                 right=tuple(range(1, 7)))]
    plot = ctx.plot("loading_controller.png", "TTFT and chosen r over read caps")
    files = ["loading_controller.jsonl"]
    if "loading_controller.jsonl" not in ctx.runs and "loading_controller.log" in ctx.runs:
        files = ["loading_controller.log"]
    out += ["", ctx.provenance(files)]
    if plot:
        out += ["", plot]
    return "\n".join(out)


def region_quality_ratio(ctx):
    rows = ctx.jsonl("quality_ratio.jsonl")
    blend = only(rows, mode="blend") or rows
    t = [(ratio_label(r), fnum(r["f1"], 3), fnum(r["fidelity_f1"], 3), fnum(r["top1_agree"], 2),
          fnum(r["kl_first"], 4), gap_closed(r), fnum(r.get("top1_tf"), 3),
          fms(r["ttft_ms_median"]), fratio(r["computed_fraction"]))
         for r in blend]
    out = [quality_setup(blend[0]), "",
           table(["r", "F1", "fidelity F1", "top-1 agree", "KL(first token)",
                  "gap closed (first / tf)", "top-1 tf", "TTFT median (ms)", "computed"], t,
                 right=tuple(range(1, 9)))]
    plot = ctx.plot("quality_ratio.png", "fidelity vs ratio")
    out += ["", ctx.provenance(["quality_ratio.jsonl"])]
    if plot:
        out += ["", plot]
    return "\n".join(out)


RAG_ROW = re.compile(r"^\s+(.+?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)/(\d+)\s+([\d.]+)\s+"
                     r"([\d.]+)x\s*$")


def region_rag(ctx):
    text = ctx.text("rag_demo.txt")
    answers, question = [], None
    rows, in_table, footer = [], False, ""
    for line in text.splitlines():
        if line.startswith("== ") and not line.startswith("== ingest"):
            question = line[3:].strip()
            answers.append([question, "", ""])
        elif question and re.match(r"^\s+(blend|full)\s*:", line):
            mode, ans = line.split(":", 1)
            answers[-1][1 if mode.strip() == "blend" else 2] = ans.strip()
        elif line.startswith("Time to first token"):
            in_table = True
        elif in_table and RAG_ROW.match(line):
            rows.append(RAG_ROW.match(line).groups())
        elif in_table and line.strip().startswith("("):
            footer = line.strip()
    if not rows:
        raise BadInput(f"{ctx.path('rag_demo.txt')}: no TTFT table (did the demo run?)")

    def esc(s):
        return s.replace("|", "\\|")

    out = [table(["question", "blend answer", "full prefill answer"],
                 [(esc(q), esc(b), esc(f)) for q, b, f in answers]), "",
           table(["question", "request tokens", "blend TTFT (ms)", "r", "cache hits/misses",
                  "full TTFT (ms)", "full / blend"],
                 [(esc(lab), n, b, r, f"{h}/{m}", f, f"{x}x") for lab, n, b, r, h, m, f, x in rows],
                 right=(1, 2, 3, 5, 6))]
    if footer:
        out += ["", footer.strip("()").rstrip(".") + "."]
    out += ["", ctx.provenance(["rag_demo.txt"])]
    return "\n".join(out)


# name: (renderer, run_benchmarks.sh section that produces its inputs)
REGIONS = {
    "machine": (region_machine, "machine"),
    "speed": (region_speed, "speed"),
    "vs-llamacpp": (region_vs_llamacpp, "speed (with `make peer`)"),
    "ttft": (region_ttft, "ttft"),
    "ttft-caps": (region_ttft_caps, "ttft"),
    "quality": (region_quality, "quality"),
    "chunk-head": (region_chunk_head, "head"),
    "codecs": (region_codecs, "codecs"),
    "codec-sizes": (region_codec_sizes, "codecs"),
    "pipeline": (region_pipeline, "pipeline"),
    "controller": (region_controller, "controller"),
    "quality-ratio": (region_quality_ratio, "ratio"),
    "rag": (region_rag, "rag"),
}
