#!/usr/bin/env python3
"""Rewrites the generated regions of docs/BENCHMARKS.md from benchmark outputs.

  scripts/write_benchmarks_md.py --bench-dir docs/bench --doc docs/BENCHMARKS.md

scripts/run_benchmarks.sh calls this at the end of a full run; run it by hand
to redraw the doc from outputs already in --bench-dir (no benchmark runs).

The doc marks each generated region with two lines of their own:

  <!-- generated:NAME -->
  ...replaced on every run...
  <!-- /generated:NAME -->

Only the text between a pair is rewritten; everything outside (the analysis,
the history, figures measured by hand) is kept byte for byte.  NAME is one of
the regions listed by --list; each reads fixed files of --bench-dir (the
outputs of run_benchmarks.sh) and writes a table of their figures, the exact
commands that produced them (from DIR/runs.tsv, which run_benchmarks.sh keeps)
and a link to the plot, if any.

A region whose input files are missing is left as it was and named on
stderr (so a partial `run_benchmarks.sh --only ...` updates just its own
regions); so is a region whose inputs cannot be read, but that also makes
the exit status 1.  A marker that is malformed, unknown, duplicated or not
balanced is an error: exit status 2 and the doc is not touched.  The output
depends only on the input files, so a second run changes nothing.
"""
import argparse
import os
import re
import sys
import tempfile

from benchmark_regions import PROG, REGIONS, BadInput, Context, Missing


class DocError(Exception):
    """The doc's markers are wrong: nothing is written."""


# ---------------------------------------------------------------------------
# The doc


MARKER = re.compile(r"^<!-- (/?)generated:([A-Za-z0-9_-]+) -->$")
MARKER_LIKE = re.compile(r"^\s*<!--\s*/?\s*generated\b")


def find_regions(lines, doc):
    """[(name, index of the opening line, index of the closing line)]."""
    regions, opened, names = [], None, set()
    for i, line in enumerate(lines):
        text = line.rstrip("\r\n")
        m = MARKER.match(text.strip())
        if not m:
            if MARKER_LIKE.match(text):
                raise DocError(f"{doc}:{i + 1}: malformed marker '{text.strip()}' (write "
                               "'<!-- generated:NAME -->' or '<!-- /generated:NAME -->' "
                               "on a line of its own)")
            continue
        closing, name = m.group(1) == "/", m.group(2)
        if not closing:
            if opened:
                raise DocError(f"{doc}:{opened[1] + 1}: generated:{opened[0]} is not closed: "
                               f"generated:{name} opens on line {i + 1} first")
            if name not in REGIONS:
                raise DocError(f"{doc}:{i + 1}: unknown region generated:{name} (known: "
                               f"{', '.join(REGIONS)})")
            if name in names:
                raise DocError(f"{doc}:{i + 1}: generated:{name} appears twice")
            names.add(name)
            opened = (name, i)
        else:
            if not opened:
                raise DocError(f"{doc}:{i + 1}: /generated:{name} closes a region that "
                               "was never opened")
            if opened[0] != name:
                raise DocError(f"{doc}:{i + 1}: /generated:{name} closes generated:"
                               f"{opened[0]} (opened on line {opened[1] + 1})")
            regions.append((name, opened[1], i))
            opened = None
    if opened:
        raise DocError(f"{doc}:{opened[1] + 1}: generated:{opened[0]} is never closed "
                       f"(no '<!-- /generated:{opened[0]} -->')")
    return regions


def rewrite(doc_text, ctx, doc, only_regions=None):
    """The new doc text and the exit status (0, or 1 when an input was unreadable)."""
    lines = doc_text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    regions = find_regions(lines, doc)
    if not regions:
        print(f"{PROG}: {doc} has no '<!-- generated:NAME -->' regions", file=sys.stderr)
    status, messages, bodies = 0, [], {}
    for name, start, end in regions:
        if only_regions and name not in only_regions:
            continue
        render, section = REGIONS[name]
        try:
            bodies[name] = render(ctx).strip("\n")
        except Missing as e:
            messages.append(f"generated:{name} left unchanged: {e} is missing "
                            f"(run_benchmarks.sh section '{section}')")
        except BadInput as e:
            messages.append(f"generated:{name} left unchanged: {e}")
            status = 1
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
            messages.append(f"generated:{name} left unchanged: unexpected input in "
                            f"{ctx.dir}: {type(e).__name__}: {e}")
            status = 1
    # From the end, so that earlier line numbers stay valid.
    for name, start, end in reversed(regions):
        if name not in bodies:
            continue
        new = [newline] + [ln + newline for ln in bodies[name].split("\n")] + [newline]
        if lines[start + 1:end] != new:
            messages.append(f"generated:{name} updated")
        lines[start + 1:end] = new
    order = {f"generated:{name} ": i for i, (name, _, _) in enumerate(regions)}
    for m in sorted(messages, key=lambda m: order.get(m.split(" ", 1)[0] + " ", 0)):
        print(f"{PROG}: {m}", file=sys.stderr)
    return "".join(lines), status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Regions: " + ", ".join(REGIONS))
    ap.add_argument("--bench-dir", default="docs/bench",
                    help="run_benchmarks.sh's output directory (default docs/bench)")
    ap.add_argument("--doc", default="docs/BENCHMARKS.md", help="the doc to rewrite in place")
    ap.add_argument("--only", default="", help="comma-separated regions to rewrite (default all)")
    ap.add_argument("--list", action="store_true", help="list the regions and their inputs' "
                    "run_benchmarks.sh sections, then exit")
    args = ap.parse_args()
    if args.list:
        for name, (_, section) in REGIONS.items():
            print(f"{name:14} run_benchmarks.sh section {section}")
        return 0
    only_regions = {x for x in args.only.split(",") if x}
    unknown = only_regions - set(REGIONS)
    if unknown:
        print(f"{PROG}: unknown region(s) in --only: {', '.join(sorted(unknown))}",
              file=sys.stderr)
        return 2
    if not os.path.isdir(args.bench_dir):
        print(f"{PROG}: no bench directory {args.bench_dir}", file=sys.stderr)
        return 2
    try:
        with open(args.doc, encoding="utf-8", newline="") as f:
            old = f.read()
    except OSError as e:
        print(f"{PROG}: cannot read {args.doc}: {e}", file=sys.stderr)
        return 2
    try:
        new, status = rewrite(old, Context(args.bench_dir, args.doc), args.doc, only_regions)
    except DocError as e:
        print(f"{PROG}: error: {e}; {args.doc} not modified", file=sys.stderr)
        return 2
    if new != old:
        # Write beside it and rename, so that a failure never leaves half a doc.
        d = os.path.dirname(os.path.abspath(args.doc))
        fd, tmp = tempfile.mkstemp(prefix=".benchmarks_md.", dir=d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(new)
            os.chmod(tmp, os.stat(args.doc).st_mode & 0o777)
            os.replace(tmp, args.doc)
        except BaseException:
            os.unlink(tmp)
            raise
        print(f"{PROG}: {args.doc} rewritten", file=sys.stderr)
    else:
        print(f"{PROG}: {args.doc} unchanged", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
