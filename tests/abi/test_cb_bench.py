#!/usr/bin/env python3
"""Command-line tests of cb_bench.

  test_cb_bench.py --bench build/bin/cb_bench --model models/X.gguf

$CB_MODEL, when set, overrides --model.  Checks the chat answer, the --json
output (generate, prefill, decode, ttft, quality on a tiny dataset written
here: teacher-forced fidelity, the gap closed, selection policies), --plot FILE.png for ttft (against the ratio and against a list of read
caps) and quality (against a list of ratios), ttft --tiers (the same request against ram,
flash, slow and tiered stores: per-tier hits, and bitwise the same logits whichever tier
served, given one codec), and that bad input (truncated / wrong-magic / absurd model files, a
prompt longer than the context, a missing file, bad flags) gives a one-line
"cb_bench: error: " message and exit status 1 (2 for usage errors), never a
crash.  Prints "N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from check_harness import check, describe, finish  # noqa: E402


def run(bench, args, env=None, timeout=300):
    e = dict(os.environ)
    e.pop("CB_MODEL", None)
    e.pop("CB_DEV_DATA", None)
    if env:
        e.update(env)
    p = subprocess.run([bench] + args, capture_output=True, timeout=timeout, env=e)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def expect_error(bench, args, what, code=1, must_contain=None, env=None):
    rc, out, err = run(bench, args, env=env)
    lines = [l for l in err.splitlines() if l.strip()]
    ok = (rc == code and len(lines) == 1 and lines[0].startswith("cb_bench: error: ")
          and (must_contain is None or must_contain.lower() in lines[0].lower()))
    check(ok, what, describe(rc, out, err))
    return err

def json_lines(out):
    """The JSON objects of stdout, one per line, or None if any line is not one."""
    try:
        objs = [json.loads(l) for l in out.splitlines() if l.strip()]
    except ValueError:
        return None
    return objs if all(isinstance(o, dict) for o in objs) else None


NUM = (int, float)
TTFT_FIELDS = {"bench": str, "mode": str, "threads": int, "model": str, "ttft_ms": NUM,
               "load_ms": NUM, "compute_ms": NUM, "ratio": NUM, "bytes_read": int, "n_ctx": int,
               "computed_fraction": NUM, "cache_hits": int, "cache_misses": int,
               "fetch_ms": NUM, "upload_ms": NUM, "fetch_threads": int}
QUALITY_FIELDS = {"bench": str, "mode": str, "threads": int, "model": str, "n": int, "f1": NUM,
                  "fidelity_f1": NUM, "top1_agree": NUM, "kl_first": NUM,
                  "ttft_ms_median": NUM, "kl_tf_mean": NUM, "top1_tf": NUM,
                  "exact_answer": NUM, "computed_fraction": NUM, "request_tokens_median": NUM}

# Two examples whose answers are in the second chunk, facts the default model
# states correctly after a full prefill.
TINY_DATASET = [
    {"question": "What is the secret code of the vault?", "answers": ["4721"],
     "ctxs": [{"title": "Museum",
               "text": "The museum opens at nine in the morning and closes at five in the "
                       "evening."},
              {"title": "Vault",
               "text": "The secret code of the vault is 4721. Only the bank manager knows it."}]},
    {"question": "What is the capital of France?", "answers": ["Paris"],
     "ctxs": [{"title": "Rivers",
               "text": "The Seine flows through northern France into the English Channel."},
              {"title": "France", "text": "Paris is the capital and largest city of France."}]},
]


def missing_fields(obj, fields):
    return [k for k, t in fields.items()
            if not isinstance(obj.get(k), t) or isinstance(obj.get(k), bool)]


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    try:
        with open(path, "rb") as f:
            return f.read(8) == PNG_SIGNATURE and os.path.getsize(path) > 1000
    except OSError:
        return False


def test_musique_dataset(bench, common, tmp):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                          "musique_dataset.py")
    split = os.path.join(tmp, "musique.jsonl")
    paragraphs = [{"idx": i, "title": ex["title"], "paragraph_text": ex["text"],
                   "is_supporting": i == 0} for i, ex in enumerate(TINY_DATASET[0]["ctxs"])]
    with open(split, "w") as f:
        for answerable in (False, True):
            f.write(json.dumps({"id": "q", "question": TINY_DATASET[0]["question"],
                                "answer": TINY_DATASET[0]["answers"][0],
                                "answer_aliases": ["alias"], "paragraphs": paragraphs,
                                "answerable": answerable}) + "\n")
    out = os.path.join(tmp, "musique.json")
    p = subprocess.run([sys.executable, script, split, out], capture_output=True, text=True)
    data = json.load(open(out)) if p.returncode == 0 else []
    check(p.returncode == 0 and len(data) == 1
          and data[0]["answers"] == TINY_DATASET[0]["answers"][:1] + ["alias"]
          and data[0]["ctxs"] == TINY_DATASET[0]["ctxs"],
          "musique_dataset.py: answerable questions in cb_bench's format", p.stderr)
    rc, out_text, err = run(bench, ["quality", "--limit", "1", "--modes", "full,reuse",
                                    "--tf-tokens", "2", "--json"] + common,
                            env={"CB_DEV_DATA": out})
    check(rc == 0 and [o.get("mode") for o in json_lines(out_text) or []] == ["full", "reuse"],
          "quality reads $CB_DEV_DATA without --dataset", describe(rc, out_text, err))
    with open(split, "w") as f:
        f.write('{"question": "no paragraphs"}\n')
    p = subprocess.run([sys.executable, script, split, out], capture_output=True, text=True)
    check(p.returncode == 1 and "not a MuSiQue question" in p.stderr,
          "musique_dataset.py: a line that is not a MuSiQue question is an error", p.stderr)


def test_plots(bench, common, dataset, tmp):
    """--plot FILE.png for ttft (vs ratio, vs read cap) and quality (vs ratio)."""
    # A path that cannot be written: a clear error before any work, and
    # nothing (no image bytes) on stdout.
    rc, out, err = run(bench, ["ttft", "--chunks", "1", "--chunk-tokens", "16", "--json",
                               "--plot", os.path.join(tmp, "no_such_dir", "x.png")] + common)
    check(rc == 1 and out == "" and "cannot write" in err, "--plot into a missing directory",
          describe(rc, out, err))
    if shutil.which("gnuplot") is None:
        # Without gnuplot the option must say so plainly, before any work.
        expect_error(bench, ["ttft", "--chunks", "1", "--chunk-tokens", "16", "--plot",
                             os.path.join(tmp, "x.png")] + common, "--plot without gnuplot",
                     must_contain="gnuplot")
        return
    ttft = ["ttft", "--chunks", "2", "--chunk-tokens", "16", "--query-tokens", "8", "--repeat", "1"]
    png = os.path.join(tmp, "ttft_ratio.png")
    rc, out, err = run(bench, ttft + ["--modes", "full,reuse,blend", "--ratio", "0,0.5,1",
                                      "--plot", png] + common)
    check(rc == 0 and is_png(png), "ttft --plot: TTFT against the ratio", describe(rc, out, err))
    png = os.path.join(tmp, "ttft_caps.png")
    rc, out, err = run(bench, ttft + ["--modes", "full,blend", "--codec", "q8", "--storage-mbps",
                                      "20,2000", "--json", "--plot", png] + common)
    rows = json_lines(out) or []
    check(rc == 0 and is_png(png) and [(r.get("mode"), r.get("storage_mbps")) for r in rows]
          == [("full", 20), ("blend", 20), ("full", 2000), ("blend", 2000)]
          and all(r.get("cache_misses") == 0 for r in rows),
          "ttft --storage-mbps list: every mode per read cap, and its plot",
          describe(rc, out, err))
    png = os.path.join(tmp, "quality.png")
    rc, out, err = run(bench, ["quality", "--dataset", dataset, "--limit", "1", "--modes",
                               "full,blend", "--ratio", "0,1", "--tf-tokens", "4", "--json",
                               "--plot", png] + common)
    rows = json_lines(out) or []
    # reuse runs too: the gap that blend closes.
    check(rc == 0 and is_png(png) and is_png(png.replace(".png", "_tf.png"))
          and [(r.get("mode"), r.get("ratio")) for r in rows]
          == [("full", 1), ("blend", 0), ("blend", 1), ("reuse", 0)],
          "quality --ratio list: blend per ratio, and the fidelity plots", describe(rc, out, err))
    # r = 1 recomputes every token: the answer is full prefill's.
    check(len(rows) == 4 and rows[2].get("fidelity_f1") == 1, "quality: blend at r=1 is full",
          str(rows))
    expect_error(bench, ttft + ["--plot", os.path.join(tmp, "x.svg")] + common,
                 "--plot needs a .png name", code=2, must_contain="png")
    expect_error(bench, ttft + ["--storage-mbps", "20,x"] + common, "ttft --storage-mbps 20,x",
                 code=2, must_contain="--storage-mbps")
    # gnuplot missing: a clear error before any work.
    expect_error(bench, ttft + ["--plot", os.path.join(tmp, "y.png")] + common,
                 "--plot without gnuplot on the PATH", must_contain="gnuplot",
                 env={"PATH": tmp})


def test_tiers(bench, common):
    """ttft --tiers: the same request against ram, flash, slow and tiered stores."""
    t = ["ttft", "--chunks", "3", "--chunk-tokens", "64", "--query-tokens", "8", "--repeat", "1",
         "--ratio", "0.15"]
    # 64 tokens x 30 layers x 2 x 192 f32 = 2.8 MB per chunk: the RAM tier
    # holds one of the three.  f32 activations: with int8 ones the f16
    # codec's rounding flips activation quantization steps, which would hide
    # the codec's own small cost (kl_vs_ram) in that noise.
    rc, out, err = run(bench, t + ["--tiers", "ram,flash,slow,tiered", "--ram-budget-mb", "4",
                                   "--activations", "f32", "--json"] + common)
    objs = json_lines(out) or []
    check(rc == 0 and [(o.get("store"), o.get("mode")) for o in objs]
          == [("-", "full"), ("ram", "blend"), ("flash", "blend"), ("slow", "blend"),
              ("tiered", "blend")], "ttft --tiers --json: full, then blend per store",
          describe(rc, out, err))
    by = {o.get("store"): o for o in objs}
    tiered, slow = by.get("tiered", {}), by.get("slow", {})
    check(all(o.get("cache_hits") == 3 and o.get("cache_misses") == 0 and o.get("ttft_ms", 0) > 0
              for o in objs if o.get("mode") == "blend")
          and by.get("ram", {}).get("ttft_vs_ram") == 1 and by.get("ram", {}).get("kl_vs_ram") == 0
          and slow.get("load_ms", 0) > 1000 * slow.get("bytes_read", 0) / 10e6 * 0.9,
          "ttft --tiers: every chunk cached; the slow store reads at its cap", out)
    # One codec (f16) on flash, the slow directory and the tiered store: the
    # tier a chunk came from changes nothing in the output.
    check(slow.get("logits_identical_to_flash") is True
          and tiered.get("logits_identical_to_flash") is True
          and 0 <= tiered.get("kl_vs_ram", 1) < 1e-4,
          "ttft --tiers: same codec, bitwise the same logits whichever tier served", out)
    hits = tiered.get("tier_hits_per_request", "")
    check(hits.startswith("ram:") and " flash:" in hits and " slow:" in hits
          and sum(float(h.split(":")[1]) for h in hits.split()) == 3,
          "ttft --tiers: per-tier hits of the tiered store", hits)
    rc, out, err = run(bench, t + ["--tiers", "flash,tiered", "--ram-budget-mb", "4"] + common)
    check(rc == 0 and "vs_ram" in out and "tier hits per request" in out,
          "ttft --tiers: the table", describe(rc, out, err))
    expect_error(bench, t + ["--tiers", "ram,disk"] + common, "ttft --tiers ram,disk", code=2,
                 must_contain="disk")
    expect_error(bench, t + ["--tiers", "tiered"] + common, "ttft --tiers tiered without a budget",
                 code=2, must_contain="--ram-budget-mb")
    expect_error(bench, t + ["--tiers", "flash", "--store", "/tmp/x"] + common,
                 "ttft --tiers with --store", code=2, must_contain="--store")
    expect_error(bench, t + ["--ram-budget-mb", "4"] + common, "ttft --ram-budget-mb without --tiers",
                 code=2, must_contain="--tiers")


def test_rag(bench, common):
    # ttft --json: one line per mode, with the contract's fields.
    rc, out, err = run(bench, ["ttft", "--chunks", "2", "--chunk-tokens", "64", "--repeat", "1",
                               "--json"] + common)
    objs = json_lines(out)
    check(rc == 0 and objs is not None and [o.get("mode") for o in objs]
          == ["full", "prefix", "reuse", "blend"], "ttft --json: a line per mode",
          describe(rc, out, err))
    if rc == 0 and objs:
        by_mode = {o.get("mode"): o for o in objs}
        bad = {o.get("mode"): missing_fields(o, TTFT_FIELDS) for o in objs}
        check(not any(bad.values()), "ttft --json fields", str(bad))
        ok = all(o.get("bench") == "ttft" and o.get("threads") == 2 and o.get("ttft_ms", 0) > 0
                 and o.get("cache_misses") == 0 and o.get("n_ctx", 0) > 2 * 64 for o in objs)
        check(ok, "ttft: positive TTFT, cached chunks, request length", out)
        full, blend, reuse = by_mode.get("full", {}), by_mode.get("blend", {}), by_mode.get("reuse", {})
        check(full.get("ratio") == 1 and full.get("computed_fraction") == 1
              and full.get("cache_hits") == 0 and abs(blend.get("ratio", 0) - 0.2) < 1e-6
              and blend.get("select") == "lookahead"
              and blend.get("cache_hits") == 2
              and 0 < reuse.get("computed_fraction", 1) < blend.get("computed_fraction", 0) < 1,
              "ttft: ratios, hits and computed fractions per mode", out)
    # Several ratios and the table.
    rc, out, err = run(bench, ["ttft", "--chunks", "2", "--chunk-tokens", "32", "--repeat", "1",
                               "--modes", "full,blend", "--ratio", "0,1"] + common)
    check(rc == 0 and "vs_full" in out and out.count("blend") >= 2, "ttft table with two ratios",
          describe(rc, out, err))

    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "tiny.json")
        with open(data, "w") as f:
            json.dump(TINY_DATASET, f)
        rc, out, err = run(bench, ["quality", "--dataset", data, "--tf-tokens", "8", "--json"]
                           + common)
        objs = json_lines(out)
        check(rc == 0 and objs is not None and [o.get("mode") for o in objs]
              == ["full", "prefix", "reuse", "blend"], "quality --json: a line per mode",
              describe(rc, out, err))
        if rc == 0 and objs:
            bad = {o.get("mode"): missing_fields(o, QUALITY_FIELDS) for o in objs}
            check(not any(bad.values()), "quality --json fields", str(bad))
            full = objs[0]
            check(full.get("n") == 2 and full.get("f1", 0) > 0 and full.get("fidelity_f1") == 1
                  and full.get("top1_agree") == 1 and full.get("kl_first") == 0,
                  "quality: full answers (f1 > 0) and is its own reference", str(full))
            check(all(o.get("bench") == "quality" and o.get("n") == 2
                      and 0 <= o.get("f1", -1) <= 1 and 0 <= o.get("fidelity_f1", -1) <= 1
                      and 0 <= o.get("top1_agree", -1) <= 1 and o.get("kl_first", -1) >= 0
                      and o.get("ttft_ms_median", 0) > 0 for o in objs),
                  "quality: metric ranges", out)
            check("example 2/2" in err, "quality: progress on stderr", err[-400:])
            # Every mode runs the same requests: the same length, head + chunks + question.
            lengths = {o.get("request_tokens_median") for o in objs}
            words = min(len(" ".join([ex["question"]] + [c["text"] for c in ex["ctxs"]]).split())
                        for ex in TINY_DATASET)
            check(len(lengths) == 1 and next(iter(lengths)) > words,
                  "quality: every mode's requests have the same length", str(lengths))
            by_mode = {o.get("mode"): o for o in objs}
            full, reuse, blend = by_mode["full"], by_mode["reuse"], by_mode["blend"]
            # Teacher forcing: full is its own reference at every position;
            # reuse differs somewhere, blend closes some of that gap.
            check(full.get("kl_tf_mean") == 0 and full.get("top1_tf") == 1
                  and full.get("exact_answer") == 1 and full.get("select") is None
                  and all(o.get("kl_tf_mean", -1) >= 0 and 0 <= o.get("top1_tf", -1) <= 1
                          and 0 <= o.get("exact_answer", -1) <= 1 for o in objs)
                  and reuse.get("gap_closed") == 0 and blend.get("select") == "lookahead"
                  and blend.get("gap_closed") is not None and blend.get("gap_closed") > 0
                  and isinstance(blend.get("gap_closed_tf"), NUM)
                  and all(o.get("tf_tokens") == 8 for o in objs),
                  "quality: teacher-forced fidelity and the gap closed", out)
            # The same keys on every line; the selection's are null outside blend.
            keys = ("select", "sink_tokens", "chunk_shift", "shift_probes", "shift_span",
                    "selected_share_mean", "guard_raised", "schedule", "gap_closed",
                    "gap_closed_tf")
            check(all(k in o for o in objs for k in keys)
                  and all(o.get(k) is None for o in objs if o.get("mode") != "blend"
                          for k in ("select", "sink_tokens", "chunk_shift", "shift_probes",
                                    "shift_span", "selected_share_mean", "guard_raised",
                                    "schedule"))
                  and blend.get("sink_tokens") == 0 and blend.get("schedule") is None
                  and blend.get("chunk_shift") is True and blend.get("shift_probes") == 0.25
                  and blend.get("shift_span") == 128
                  and 0 <= blend.get("selected_share_mean", -1) <= 1
                  and 0 <= blend.get("guard_raised", -1) <= 1,
                  "quality: selection fields", out)

        # One blend line per policy and ratio, at equal counts.
        rc, out, err = run(bench, ["quality", "--dataset", data, "--limit", "1", "--modes",
                                   "full,blend", "--select", "hkvd,random", "--ratio", "0.1,0.3",
                                   "--sink-tokens", "2", "--seed", "7", "--tf-tokens", "4",
                                   "--chunk-shift", "off", "--json"] + common)
        objs = json_lines(out) or []
        check(rc == 0 and [(o.get("mode"), o.get("select"), o.get("ratio")) for o in objs]
              == [("full", None, 1), ("blend", "hkvd", 0.1), ("blend", "hkvd", 0.3),
                  ("blend", "random", 0.1), ("blend", "random", 0.3), ("reuse", None, 0)]
              and all(o.get("sink_tokens") == 2 and o.get("chunk_shift") is False
                      and o.get("shift_probes") == 0 and o.get("shift_span") == 0
                      for o in objs if o.get("mode") == "blend")
              and all(o.get("kl_tf_mean", -1) >= 0 and 0 <= o.get("top1_tf", -1) <= 1
                      for o in objs)
              and objs[0].get("kl_tf_mean") == 0 and objs[0].get("top1_tf") == 1,
              "quality --select list: a line per policy and ratio", describe(rc, out, err))
        # Neighbour-aware precompute: each example's second ctx computed after
        # its only other ctx, the one before it in the request, so reusing
        # it gives full prefill's first token (alone it does not); so does
        # "store", whose only other passage it is (with --neighbours 2 too:
        # there is no second); with "outside" there is no other ctx: computed
        # alone; "unrelated" with one example has no next one: alone too.
        reuse_kl, picks, recorded = {}, {}, {}
        for how in ("", "similar", "outside", "unrelated", "store", "store --neighbours 2"):
            rc, out, err = run(bench, ["quality", "--dataset", data, "--limit", "1", "--modes",
                                       "full,reuse", "--tf-tokens", "4", "--json"]
                               + (["--neighbour-context"] + how.split() if how else []) + common)
            rows = [o for o in json_lines(out) or [] if o.get("mode") == "reuse"]
            reuse_kl[how] = rows[0].get("kl_first") if rc == 0 and rows else None
            picks[how] = "1 chunk(s) computed after a context: 1 holding another chunk" in err
            recorded[how] = [(o.get("neighbour_context"), o.get("neighbours"),
                              o.get("neighbour_chunks"), o.get("neighbour_of_request"))
                             for o in rows]
        check(None not in reuse_kl.values() and reuse_kl["similar"] < 1e-6
              and reuse_kl[""] > 100 * reuse_kl["similar"]
              and reuse_kl["store"] == reuse_kl["similar"]
              and reuse_kl["store --neighbours 2"] == reuse_kl["similar"]
              and reuse_kl["outside"] == reuse_kl[""] and reuse_kl["unrelated"] == reuse_kl[""],
              "quality --neighbour-context: a chunk computed after its predecessor is exact",
              str(reuse_kl))
        check(picks["similar"] and picks["store"] and not picks["outside"],
              "quality --neighbour-context: says where the contexts came from", str(picks))
        check(recorded[""] == [("none", None, None, None)]
              and recorded["similar"] == [("similar", 1, 1, 1)]
              and recorded["outside"] == [("outside", 1, 0, 0)]
              and recorded["store --neighbours 2"] == [("store", 2, 1, 1)],
              "quality --json: records how the chunk KV was computed", str(recorded))
        expect_error(bench, ["quality", "--dataset", data, "--neighbour-context", "nearest"]
                     + common, "quality --neighbour-context nearest", code=2,
                     must_contain="similar, outside, store or unrelated")
        expect_error(bench, ["quality", "--dataset", data, "--neighbour-context", "similar",
                             "--neighbours", "2"] + common,
                     "quality --neighbours without store", code=2,
                     must_contain="--neighbours goes with --neighbour-context store")
        rc, out, err = run(bench, ["quality", "--dataset", data, "--limit", "1", "--modes",
                                   "blend", "--select", "hkvd", "--schedule", "1:0.2,3:0.1",
                                   "--guard-share", "1", "--guard-max-ratio", "0.45",
                                   "--tf-tokens", "4", "--json"] + common)
        objs = [o for o in json_lines(out) or [] if o.get("mode") == "blend"]
        check(rc == 0 and len(objs) == 1 and objs[0].get("schedule") == "1:0.2,3:0.1"
              and objs[0].get("guard_raised") == 1,
              "quality --schedule and the quality guard", describe(rc, out, err))

        # Runtime errors (exit 1): the dataset.
        expect_error(bench, ["quality", "--dataset", os.path.join(tmp, "absent.json")] + common,
                     "quality: missing dataset file", must_contain="absent.json")
        bad_json = os.path.join(tmp, "bad.json")
        with open(bad_json, "w") as f:
            f.write('[{"question": "x", ')
        expect_error(bench, ["quality", "--dataset", bad_json] + common, "quality: invalid JSON",
                     must_contain="not valid JSON")
        wrong = os.path.join(tmp, "wrong.json")
        with open(wrong, "w") as f:
            json.dump([{"question": "x", "answers": ["y"], "ctxs": [{"title": 3}]}], f)
        expect_error(bench, ["quality", "--dataset", wrong] + common,
                     "quality: wrong dataset structure", must_contain="example 0")

        # A MuSiQue split through scripts/musique_dataset.py, found by $CB_DEV_DATA.
        test_musique_dataset(bench, common, tmp)

        # Usage errors (exit 2).
        q = ["quality", "--dataset", data]
        expect_error(bench, ["quality"] + common, "quality without --dataset", code=2,
                     must_contain="--dataset")
        expect_error(bench, q + ["--codec", "q3"] + common, "quality --codec q3", code=2,
                     must_contain="q3")
        expect_error(bench, q + ["--max-tokens", "0"] + common, "quality --max-tokens 0", code=2)
        expect_error(bench, q + ["--ratio", "0.1,x"] + common, "quality --ratio 0.1,x",
                     code=2, must_contain="--ratio")
        expect_error(bench, q + ["--select", "best"] + common, "quality --select best",
                     code=2, must_contain="best")
        expect_error(bench, q + ["--select", "hkvd,hkvd"] + common, "quality --select twice",
                     code=2, must_contain="twice")
        expect_error(bench, q + ["--select", "default,lookahead"] + common,
                     "quality --select default and the policy it names", code=2,
                     must_contain="twice")
        expect_error(bench, q + ["--sink-tokens", "2000"] + common, "quality --sink-tokens 2000",
                     code=2, must_contain="--sink-tokens")
        expect_error(bench, q + ["--chunk-shift", "maybe"] + common, "quality --chunk-shift maybe",
                     code=2, must_contain="--chunk-shift")
        expect_error(bench, q + ["--shift-probes", "1.5"] + common, "quality --shift-probes 1.5",
                     code=2, must_contain="--shift-probes")
        expect_error(bench, q + ["--shift-span", "-1"] + common, "quality --shift-span -1",
                     code=2, must_contain="--shift-span")
        expect_error(bench, q + ["--guard-share", "1.5"] + common, "quality --guard-share 1.5",
                     code=2, must_contain="--guard-share")
        expect_error(bench, q + ["--guard-max-ratio", "-0.1"] + common,
                     "quality --guard-max-ratio -0.1", code=2, must_contain="--guard-max-ratio")
        expect_error(bench, q + ["--seed", "-1"] + common, "quality --seed -1", code=2,
                     must_contain="--seed")
        expect_error(bench, q + ["--tf-tokens", "0"] + common, "quality --tf-tokens 0", code=2,
                     must_contain="--tf-tokens")
        expect_error(bench, q + ["--schedule", "1:0.3", "--ratio", "0.2"] + common,
                     "quality --schedule with --ratio", code=2, must_contain="--schedule")
        expect_error(bench, q + ["--schedule", "1-0.3"] + common, "quality --schedule 1-0.3",
                     code=2, must_contain="LAYER:RATIO")
        test_plots(bench, common, data, tmp)
        expect_error(bench, q + ["--limit", "x"] + common, "quality --limit x", code=2)
    t = ["ttft", "--chunks", "2", "--chunk-tokens", "16"]
    expect_error(bench, ["ttft", "--chunk-tokens", "16"] + common, "ttft without --chunks",
                 code=2, must_contain="--chunks")
    expect_error(bench, t + ["--ratio", "1.5"] + common, "ttft --ratio 1.5", code=2,
                 must_contain="[0, 1]")
    expect_error(bench, t + ["--ratio", "0.1,x"] + common, "ttft --ratio 0.1,x", code=2)
    # Auto ratio needs a chunk store on flash (the controller reads its tiers).
    expect_error(bench, t + ["--ratio", "auto", "--repeat", "1"] + common,
                 "ttft --ratio auto without a store", must_contain="flash")
    expect_error(bench, t + ["--pipeline", "maybe"] + common, "ttft --pipeline maybe", code=2)
    expect_error(bench, t + ["--modes", "full,bogus"] + common, "ttft --modes with a bad mode",
                 code=2, must_contain="bogus")
    expect_error(bench, t + ["--chunk-head", "bos"] + common, "ttft --chunk-head bos", code=2)
    expect_error(bench, ["prefill", "--tokens", "8", "--backend", "gpu"] + common,
                 "--backend gpu", code=2, must_contain="--backend")
    # CUDA: runs where it is built and a device exists; else one clear error.
    rc, out, err = run(bench, ["prefill", "--tokens", "8", "--repeat", "1", "--backend", "cuda"]
                       + common)
    if rc != 0:
        expect_error(bench, ["prefill", "--tokens", "8", "--repeat", "1", "--backend", "cuda"]
                     + common, "--backend cuda without CUDA", must_contain="cuda")
    expect_error(bench, t + ["--chunks", "0"] + common, "ttft --chunks 0", code=2)
    expect_error(bench, t + ["--codec", "q4", "--storage-mbps", "0"] + common,
                 "ttft --storage-mbps 0", code=2)
    expect_error(bench, t + ["--codec", "f32", "--storage-mbps", "100"] + common,
                 "ttft --codec f32 on flash", code=2, must_contain="keeps chunk KV in RAM")
    # A read cap without --codec: the store's f16.
    rc, out, err = run(bench, t + ["--storage-mbps", "1000", "--modes", "reuse", "--repeat", "1",
                                   "--json"] + common)
    rows = json_lines(out) or []
    check(rc == 0 and len(rows) == 1 and rows[0].get("codec") == "f16"
          and rows[0].get("bytes_read", 0) > 0, "ttft --storage-mbps without --codec", err)
    # Chunk KV on flash with a lossy codec and a read cap: a fixed ratio is
    # served from the store.  The loading controller's ratio either reads the
    # store too or, where its calibration says reading costs more than
    # recomputing the reused tokens (a close call for 32 reused tokens of the
    # 135M model, decided by timings on a loaded machine), recomputes
    # everything and reads nothing.
    rc, out, err = run(bench, t + ["--codec", "q4", "--storage-mbps", "50", "--ratio", "0.15,auto",
                                   "--modes", "blend", "--repeat", "1", "--json"] + common)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    check(rc == 0 and len(rows) == 2, "ttft --codec q4 --ratio 0.15,auto", err)
    for r in rows:
        check(r.get("codec") == "q4" and r.get("cache_misses") == 0,
              "ttft on flash finds every chunk in the store", str(r))
    if len(rows) == 2:
        check(rows[0].get("bytes_read", 0) > 0,
              "ttft on flash at a fixed ratio reads the chunks from the store", str(rows[0]))
        auto = rows[1]
        reads = auto.get("bytes_read", 0) > 0 and 0.15 <= auto.get("ratio", 0) <= 1.0
        recomputes = (auto.get("bytes_read") == 0 and auto.get("ratio") == 1
                      and auto.get("computed_fraction") == 1)
        check(auto.get("ratio_mode") == "auto" and (reads or recomputes),
              "auto ratio within [r_min, 1]: reads the store, or at 1 may read nothing", str(auto))
    # Runtime errors (exit 1): a request longer than the context.
    expect_error(bench, ["ttft", "--chunks", "64", "--chunk-tokens", "512"] + common,
                 "ttft request over the model's context", must_contain="context")
    expect_error(bench, t + ["--n-ctx", "40", "--repeat", "1"] + common,
                 "ttft request over --n-ctx", must_contain="context")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    bench = a.bench
    model = os.environ.get("CB_MODEL") or a.model
    common = ["--model", model, "--threads", "2"]

    # The chat answer.  An explicit system message: with its template's own
    # default system message the 135M test model answers this question
    # wrongly once int8 activations round its logits.
    system = ["--system", "You are a helpful assistant."]
    rc, out, err = run(bench, ["generate", "--chat", "--prompt", "What is the capital of France?",
                               "--max-tokens", "16"] + system + common)
    check(rc == 0 and "Paris" in out, "generate --chat answers Paris", describe(rc, out, err))
    # --chat-template: the model's own (ChatML) by name, and another family's
    # layout (Gemma's turns are a different number of tokens).
    n_prompt = {}
    for t in ("chatml", "gemma"):
        rc, out, err = run(bench, ["generate", "--chat", "--prompt", "Hi", "--max-tokens", "1",
                                   "--chat-template", t, "--json"] + common)
        n_prompt[t] = (json_lines(out) or [{}])[0].get("n_prompt") if rc == 0 else None
    check(None not in n_prompt.values() and n_prompt["chatml"] != n_prompt["gemma"],
          "generate --chat-template lays the chat out in the named family", str(n_prompt))
    expect_error(bench, ["generate", "--chat", "--prompt", "Hi", "--chat-template", "vicuna"]
                 + common, "generate --chat-template vicuna", code=2, must_contain="vicuna")

    # --json: one object with the contract's fields.
    rc, out, err = run(bench, ["generate", "--chat", "--prompt", "What is the capital of France?",
                               "--max-tokens", "16", "--json"] + system + common)
    obj = None
    try:
        lines = [l for l in out.splitlines() if l.strip()]
        obj = json.loads(lines[0]) if len(lines) == 1 else None
    except (ValueError, IndexError):
        obj = None
    check(rc == 0 and isinstance(obj, dict), "generate --json prints one JSON object",
          describe(rc, out, err))
    if isinstance(obj, dict):
        fields = {"bench": str, "mode": str, "threads": int, "model": str, "text": str,
                  "tokens": list, "n_prompt": int, "ttft_ms": (int, float), "tok_s": (int, float)}
        missing = [k for k, t in fields.items() if not isinstance(obj.get(k), t)]
        check(not missing, "generate --json has the required fields", f"missing/bad: {missing}")
        check(obj.get("bench") == "generate" and obj.get("mode") == "full"
              and obj.get("threads") == 2, "generate --json bench/mode/threads values", str(obj))
        check("Paris" in obj.get("text", "") and all(isinstance(t, int) for t in obj["tokens"])
              and 0 < len(obj["tokens"]) <= 16, "generate --json text and token ids", str(obj))

    # prefill / decode --json (small sizes, fast).
    for cmd, extra, keys in (("prefill", ["--tokens", "32", "--repeat", "1"], ["tok_s", "ms"]),
                             ("decode", ["--tokens", "4", "--ctx", "8"], ["tok_s"])):
        rc, out, err = run(bench, [cmd] + extra + ["--json"] + common)
        try:
            obj = json.loads(out)
        except ValueError:
            obj = None
        ok = (rc == 0 and isinstance(obj, dict) and obj.get("bench") == cmd
              and all(isinstance(obj.get(k), (int, float)) and obj[k] > 0 for k in keys)
              and obj.get("mode") == "full" and obj.get("threads") == 2 and obj.get("model"))
        check(ok, f"{cmd} --json", describe(rc, out, err))
    rc, out, err = run(bench, ["prefill", "--tokens", "16", "--repeat", "1"] + common)
    check(rc == 0 and "tok/s" in out, "prefill prints a table", describe(rc, out, err))
    # CB_CPU_KERNELS: the kernel level the CPU backend takes, reported in
    # the JSON; a name that is no level is a clean error.
    rc, out, err = run(bench, ["decode", "--tokens", "2", "--ctx", "8", "--json"] + common,
                       env={"CB_CPU_KERNELS": "scalar"})
    check(rc == 0 and (json_lines(out) or [{}])[0].get("kernels") == "scalar",
          "CB_CPU_KERNELS=scalar runs the scalar kernels", describe(rc, out, err))
    expect_error(bench, ["decode", "--tokens", "2"] + common, "CB_CPU_KERNELS=sse",
                 must_contain="CB_CPU_KERNELS=sse is not a kernel level",
                 env={"CB_CPU_KERNELS": "sse"})

    test_rag(bench, common)
    test_tiers(bench, common)

    # Help and usage errors (exit 2).
    rc, out, err = run(bench, ["--help"])
    check(rc == 0 and "generate" in out and "--threads" in out and "ttft" in out
          and "quality" in out, "--help", describe(rc, out, err))
    expect_error(bench, [], "no command", code=2)
    expect_error(bench, ["frobnicate"], "unknown command", code=2, must_contain="frobnicate")
    expect_error(bench, ["generate", "--prompt", "x", "--bogus"] + common, "unknown flag", code=2,
                 must_contain="--bogus")
    expect_error(bench, ["generate", "--prompt"], "missing value", code=2,
                 must_contain="needs a value")
    expect_error(bench, ["generate", "--prompt", "x", "--max-tokens", "12abc"] + common,
                 "bad number", code=2, must_contain="--max-tokens")
    expect_error(bench, ["prefill", "--tokens", "-3"] + common, "negative count", code=2)
    expect_error(bench, ["generate", "--prompt", "x", "--top-p", "nan"] + common, "NaN", code=2)
    expect_error(bench, ["generate", "--max-tokens", "3"] + common, "missing --prompt", code=2,
                 must_contain="--prompt")

    # Runtime errors (exit 1).
    with tempfile.TemporaryDirectory() as tmp:
        missing = os.path.join(tmp, "nope.gguf")
        expect_error(bench, ["generate", "--prompt", "x", "--model", missing], "missing model file",
                     must_contain="nope.gguf")
        # Without --model or CB_MODEL, from another directory: the default
        # model of the source tree (the same rule as rag_assistant's), or,
        # where it was not fetched (the default set-up leaves it out), an
        # error that says how to fetch it.
        p = subprocess.run([os.path.abspath(bench), "generate", "--prompt", "x", "--max-tokens",
                            "1", "--threads", "1"],
                           capture_output=True, cwd=tmp, text=True,
                           env={k: v for k, v in os.environ.items() if k != "CB_MODEL"})
        default = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models",
                               "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
        if os.path.isfile(default):
            check(p.returncode == 0, "the default model is found from another directory",
                  describe(p.returncode, p.stdout, p.stderr))
        else:
            check(p.returncode == 1 and "scripts/setup.sh model qwen1.5b" in p.stderr,
                  "without the default model, the error says how to fetch it",
                  describe(p.returncode, p.stdout, p.stderr))
        expect_error(bench, ["generate", "--prompt", "x"], "missing CB_MODEL file",
                     must_contain="nope.gguf", env={"CB_MODEL": missing})

        with open(model, "rb") as f:
            head = f.read(1 << 20)
        size = os.path.getsize(model)

        def variant(name, data):
            p = os.path.join(tmp, name)
            with open(p, "wb") as f:
                f.write(data)
            return p

        bad_files = [("truncated to 1000 bytes", variant("t1000.gguf", head[:1000]))]
        half = os.path.join(tmp, "half.gguf")
        with open(model, "rb") as src, open(half, "wb") as dst:
            remaining = size // 2
            while remaining > 0:
                chunk = src.read(min(remaining, 1 << 22))
                if not chunk:
                    break
                dst.write(chunk)
                remaining -= len(chunk)
        bad_files.append(("truncated to half", half))
        bad_files.append(("wrong magic", variant("magic.gguf", b"GGML" + head[4:4096])))
        # A full copy whose tensor count (uint64 at offset 8) is 2^60.
        absurd = os.path.join(tmp, "tensors.gguf")
        shutil.copyfile(model, absurd)
        with open(absurd, "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<Q", 1 << 60))
        bad_files.append(("tensor count 2^60", absurd))
        bad_files.append(("empty file", variant("empty.gguf", b"")))
        bad_files.append(("a directory", tmp))
        for what, path in bad_files:
            expect_error(bench, ["generate", "--prompt", "x", "--max-tokens", "1", "--model", path,
                                 "--threads", "2"], f"bad model: {what}")

        # general.name is printed escaped in the text output: a newline in
        # it cannot forge a line, nor an escape sequence reach the terminal.
        # The name is overwritten in place, at its own length.
        renamed = os.path.join(tmp, "renamed.gguf")
        shutil.copyfile(model, renamed)
        key = b"general.name"
        at = head.find(struct.pack("<Q", len(key)) + key)
        (name_len,) = struct.unpack_from("<Q", head, at + 8 + len(key) + 4)
        forged = b"x\nforged line\x1b[2J\xc2\x9b"
        check(at > 0 and name_len >= len(forged), "the test model has a general.name to rewrite",
              str((at, name_len)))
        with open(renamed, "r+b") as f:
            f.seek(at + 8 + len(key) + 4 + 8)
            f.write(forged + b"-" * (name_len - len(forged)))
        rc, out, err = run(bench, ["generate", "--prompt", "x", "--max-tokens", "1", "--model",
                                   renamed, "--threads", "2"])
        check(rc == 0 and "[x\\x0aforged line\\x1b[2J\\xc2\\x9b---" in err
              and not any(l.startswith("forged") for l in err.splitlines())
              and "\x1b" not in err and "\u009b" not in err,
              "the model's general.name is printed escaped", describe(rc, out, err))

        # A prompt longer than the context.
        long_prompt = "The quick brown fox jumps over the lazy dog. " * 20
        expect_error(bench, ["generate", "--prompt", long_prompt, "--n-ctx", "16",
                             "--max-tokens", "4"] + common, "prompt longer than the context",
                     must_contain="context")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
