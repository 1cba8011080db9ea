#!/usr/bin/env python3
"""Test of scripts/write_benchmarks_md.py (and run_benchmarks.sh's guards).

  test_write_benchmarks.py [--root REPO]

No model and no benchmark runs: the generator reads the checked-in outputs of
a quick run in tests/samples/fixtures/bench/ and rewrites a copy of
BENCHMARKS.fixture.md (every region, prose around them).  Checks that every
region is replaced with its figures, command and plot link; that everything
outside the markers is kept byte for byte; that a second run changes nothing;
that a missing input leaves its region as it was and says so; that an
unreadable input does the same with exit status 1; that a malformed or
unbalanced marker is an error (status 2) that leaves the doc untouched; that
docs/BENCHMARKS.md's own markers parse; and that run_benchmarks.sh --quick
refuses to write into docs/.  Prints "N passed, N failed"; exit status 1 on
any failure.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from check_harness import check, finish  # noqa: E402

REGIONS = ["machine", "speed", "vs-llamacpp", "ttft", "ttft-caps", "quality", "chunk-head",
           "codecs", "codec-sizes", "pipeline", "controller", "quality-ratio", "rag"]
MARK = re.compile(r"^<!-- (/?)generated:([A-Za-z0-9_-]+) -->$")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def outside(text):
    """The doc without the insides of its regions (marker lines kept)."""
    kept, inside = [], False
    for line in text.splitlines(keepends=True):
        m = MARK.match(line.rstrip("\r\n"))
        if m:
            inside = m.group(1) != "/"
            kept.append(line)
        elif not inside:
            kept.append(line)
    return "".join(kept)


def regions(text):
    """{name: the text between its markers}."""
    out, name, buf = {}, None, []
    for line in text.splitlines(keepends=True):
        m = MARK.match(line.rstrip("\r\n"))
        if m and m.group(1) != "/":
            name, buf = m.group(2), []
        elif m:
            out[m.group(2)] = "".join(buf)
            name = None
        elif name:
            buf.append(line)
    return out


class Env:
    def __init__(self, root, tmp):
        self.root = root
        self.tmp = tmp
        self.script = os.path.join(root, "scripts", "write_benchmarks_md.py")
        self.fixtures = os.path.join(root, "tests", "samples", "fixtures", "bench")
        self.n = 0

    def layout(self, drop=(), empty=()):
        """A fresh docs/ with the fixture doc and bench dir (minus `drop`)."""
        self.n += 1
        docs = os.path.join(self.tmp, f"case{self.n}", "docs")
        bench = os.path.join(docs, "bench")
        shutil.copytree(self.fixtures, bench)
        doc = os.path.join(docs, "BENCHMARKS.md")
        shutil.move(os.path.join(bench, "BENCHMARKS.fixture.md"), doc)
        for name in drop:
            os.remove(os.path.join(bench, name))
        for name in empty:
            open(os.path.join(bench, name), "w").close()
        # A plot for the ttft region to link (the fixture has no images).
        open(os.path.join(bench, "ttft_ratio.png"), "wb").close()
        return doc, bench

    def gen(self, doc, bench, *extra):
        p = subprocess.run([sys.executable, self.script, "--bench-dir", bench, "--doc", doc,
                            *extra], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stderr


def table_shapes_ok(text):
    """Every Markdown table row has as many cells as its header."""
    cols = None
    for line in text.splitlines():
        if not line.startswith("|"):
            cols = None
            continue
        n = len(re.findall(r"(?<!\\)\|", line)) - 1
        if cols is None:
            cols = n
        elif n != cols:
            return False, line
    return True, ""


def test_full(env):
    doc, bench = env.layout()
    before = read(doc).decode()
    rc, err = env.gen(doc, bench)
    after = read(doc).decode()
    check(rc == 0, "full fixture: exit status 0", f"rc={rc} stderr={err}")
    check(outside(after) == outside(before), "full fixture: prose outside the markers kept "
          "byte for byte")
    check("OLD CONTENT" not in after, "full fixture: every region replaced",
          [n for n, t in regions(after).items() if "OLD CONTENT" in t])
    got = regions(after)
    check(sorted(got) == sorted(REGIONS), "full fixture: all regions still there", sorted(got))
    expect = {
        "machine": ["Quick run", "AMD EPYC", "1234abc", "2026-11-22 17:14 UTC"],
        "speed": ["| prefill 64 | 229.8 |", "decode 16", "cb_bench prefill --tokens 128"],
        "vs-llamacpp": ["| prefill 64 | 262.8 | 24.6 | 10.69 |", "bench_vs_llamacpp.py"],
        "ttft": ["r = 0.2 (the default): **0.837x**", "| blend | 0.20 | 235 |",
                 "![TTFT per mode and ratio](bench/ttft_ratio.png)",
                 "--ratio 0.05,0.1,0.2,0.3,0.5,1.0", "run of 2026-12-04 00:26 UTC"],
        "ttft-caps": ["| 2000 | 717 (1.00x) | 264 (0.37x) | 350 (0.49x) | 364 (0.51x) |"],
        "quality": ["| blend | 0.20 | 2 |", "TTFT / full", "| 0.97 / 0.95 | 1.000 | 728 |",
                    "| reuse | 0.00 | 2 | 0.400 | 0.473 | 0.50 | 0.1075 | 0.00 / 0.00 |",
                    "--limit 2"],
        "chunk-head": ["blend (head none)", "reuse (head prompt)", "--chunk-head none"],
        "codecs": ["blend (RAM, f32)", "blend (codec q4)", "--codec q8"],
        "codec-sizes": ["| q8 | 1 | 10,674 | 0.463 |", "ms per chunk"],
        "pipeline": ["**10.8 MB/s**", "| 1 | 8199 | 5119 | 0.62 |"],
        "controller": ["| 500 | 0.15 | 256 | 257 | 0.99 |", "bench_loading_controller.py"],
        "quality-ratio": ["| 0.10 | 0.000 | 0.625 | 1.00 | 0.0101 | 0.88 / 0.70 | 0.846 | 582 |",
                          "Command not recorded"],
        "rag": ["Mochi", "| 1.78x |", "rag_demo.py"],
    }
    for name, needles in expect.items():
        text = got.get(name, "")
        missing = [s for s in needles if s not in text]
        check(not missing, f"region {name}: figures, command and links", f"missing {missing}")
    ok, bad = table_shapes_ok(after)
    check(ok, "every table row has as many cells as its header", bad)
    check("no plot" in err and "quality.png" in err,
          "a plot that is not there is reported, not linked", err)

    # A second run changes nothing.
    rc2, err2 = env.gen(doc, bench)
    check(rc2 == 0 and read(doc).decode() == after and "unchanged" in err2,
          "second run: same file (idempotent)", err2)
    return after


def test_missing(env, full_after):
    doc, bench = env.layout(drop=("ttft.jsonl", "vs_llamacpp.md"))
    before = read(doc).decode()
    rc, err = env.gen(doc, bench)
    after = read(doc).decode()
    got, old = regions(after), regions(before)
    check(rc == 0, "missing inputs: exit status 0 (a partial run is normal)", err)
    check(got["ttft"] == old["ttft"] and got["vs-llamacpp"] == old["vs-llamacpp"],
          "missing inputs: their regions left as they were")
    check("generated:ttft left unchanged" in err and "ttft.jsonl is missing" in err and
          "generated:vs-llamacpp left unchanged" in err,
          "missing inputs: named on stderr", err)
    check(got["speed"] == regions(full_after)["speed"], "missing inputs: other regions updated")
    check(outside(after) == outside(before), "missing inputs: prose kept byte for byte")

    # A partial --only run: only the speed outputs are new; the doc was
    # generated from the full set before.  Only the speed region changes.
    doc, bench = env.layout()
    env.gen(doc, bench)
    first = read(doc).decode()
    for name in os.listdir(bench):
        if not name.startswith(("prefill_", "decode_")):
            os.remove(os.path.join(bench, name))
    p = os.path.join(bench, "prefill_64.json")
    with open(p) as f:
        text = f.read().replace('"tok_s": 229.8384417', '"tok_s": 301.25')
    with open(p, "w") as f:
        f.write(text)
    rc, err = env.gen(doc, bench)
    second = read(doc).decode()
    changed = [n for n in REGIONS if regions(first)[n] != regions(second)[n]]
    check(rc == 0 and changed == ["speed"] and "| prefill 64 | 301.2 |" in second,
          "partial run: just its own region rewritten", f"changed {changed}; {err}")


def test_bad_input(env):
    doc, bench = env.layout(empty=("quality.jsonl",))
    before = read(doc).decode()
    rc, err = env.gen(doc, bench)
    after = read(doc).decode()
    check(rc == 1, "unreadable input: exit status 1", f"rc={rc}")
    check(regions(after)["quality"] == regions(before)["quality"] and
          "quality.jsonl is empty" in err, "unreadable input: region kept, reason on stderr", err)
    check("OLD CONTENT" not in regions(after)["ttft"], "unreadable input: the others updated")


def test_marker_errors(env):
    def case(what, edit, needle):
        doc, bench = env.layout()
        with open(doc, encoding="utf-8") as f:
            text = edit(f.read())
        with open(doc, "w", encoding="utf-8") as f:
            f.write(text)
        before = read(doc)
        mtime = os.stat(doc).st_mtime_ns
        rc, err = env.gen(doc, bench)
        check(rc == 2 and read(doc) == before and os.stat(doc).st_mtime_ns == mtime and
              "error" in err and needle in err and "not modified" in err,
              f"marker error, {what}: exit status 2, doc untouched, clear message",
              f"rc={rc} stderr={err}")

    close_ttft = "<!-- /generated:ttft -->\n"
    case("region not closed before the next", lambda t: t.replace(close_ttft, ""), "not closed")
    case("last region never closed", lambda t: t.replace("<!-- /generated:rag -->\n", ""),
         "never closed")
    case("closed by another name",
         lambda t: t.replace(close_ttft, "<!-- /generated:quality -->\n"), "closes generated:ttft")
    case("stray close", lambda t: "<!-- /generated:rag -->\n" + t, "never opened")
    case("nested open", lambda t: t.replace("OLD CONTENT OF ttft\n",
                                            "<!-- generated:bogus -->\n"), "not closed")
    case("unknown name", lambda t: t + "\n<!-- generated:bogus -->\n<!-- /generated:bogus -->\n",
         "unknown region")
    case("duplicate region",
         lambda t: t + "\n<!-- generated:machine -->\n<!-- /generated:machine -->\n", "twice")
    case("malformed marker",
         lambda t: t.replace("<!-- generated:ttft -->", "<!--generated:ttft-->"), "malformed marker")


def test_real_doc(env):
    real = os.path.join(env.root, "docs", "BENCHMARKS.md")
    d = os.path.join(env.tmp, "real")
    os.makedirs(os.path.join(d, "empty_bench"))
    doc = os.path.join(d, "BENCHMARKS.md")
    shutil.copy(real, doc)
    rc, err = env.gen(doc, os.path.join(d, "empty_bench"))
    names = re.findall(r"generated:([a-z-]+) left unchanged", err)
    check(rc == 0 and read(doc) == read(real),
          "docs/BENCHMARKS.md: markers parse; no inputs, no change", err)
    check(sorted(names) == sorted(REGIONS), "docs/BENCHMARKS.md: every region once",
          f"regions {sorted(names)}")


def test_run_benchmarks_guards(env):
    script = os.path.join(env.root, "scripts", "run_benchmarks.sh")
    bench = os.path.join(env.root, "docs", "bench")
    listing = sorted(os.listdir(bench)) if os.path.isdir(bench) else []
    base = dict(os.environ, BUILD=os.path.join(env.tmp, "no_build"), TMPDIR=env.tmp)
    base.pop("OUT", None)

    def run(args, **env_extra):
        p = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=60,
                           env=dict(base, **env_extra), cwd=env.tmp)
        return p.returncode, p.stdout + p.stderr

    rc, out = run(["--quick"], OUT=bench)
    check(rc == 2 and "docs/bench" in out, "run_benchmarks --quick refuses OUT=docs/bench", out)
    rc, out = run(["--quick", "--doc", os.path.join(env.root, "docs", "BENCHMARKS.md")])
    check(rc == 2 and "BENCHMARKS.md" in out,
          "run_benchmarks --quick refuses to rewrite docs/BENCHMARKS.md", out)
    rc, out = run(["--only", "speed,bogus"])
    check(rc == 2 and "unknown section" in out, "run_benchmarks --only rejects a typo", out)
    rc, out = run(["--help"])
    check(rc == 0 and "make peer" in out and "write_benchmarks_md.py" in out,
          "run_benchmarks --help says how to regenerate the doc", out[:300])
    # A missing model is named before anything runs (the stand-in cb_bench
    # leaves a mark if it is run).
    fake_bin = os.path.join(env.tmp, "fake_build", "bin")
    os.makedirs(fake_bin, exist_ok=True)
    ran = os.path.join(env.tmp, "fake_cb_bench_ran")
    with open(os.path.join(fake_bin, "cb_bench"), "w") as f:
        f.write(f"#!/bin/sh\ntouch '{ran}'\nexit 1\n")
    os.chmod(os.path.join(fake_bin, "cb_bench"), 0o755)
    rc, out = run(["--quick"], BUILD=os.path.dirname(fake_bin),
                  CB_MODEL=os.path.join(env.tmp, "no_such_model.gguf"))
    check(rc == 1 and "no model at" in out and "no_such_model.gguf" in out
          and not os.path.exists(ran), "run_benchmarks names a missing model and runs nothing",
          out[-300:])
    now = sorted(os.listdir(bench)) if os.path.isdir(bench) else []
    check(now == listing, "docs/bench untouched by the guards")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), help="the repository (default: this file's)")
    args = ap.parse_args()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="test_write_benchmarks.") as tmp:
        env = Env(os.path.abspath(args.root), tmp)
        full_after = test_full(env)
        test_missing(env, full_after)
        test_bad_input(env)
        test_marker_errors(env)
        test_real_doc(env)
        test_run_benchmarks_guards(env)
    return finish(f" ({time.monotonic() - start:.1f} s)")


if __name__ == "__main__":
    sys.exit(main())
