#!/usr/bin/env python3
"""rag_assistant's chunk KV settings end to end: when KV is computed (ingest
--kv eager|lazy|background and the precompute command), the store's codec
and size (--kv-codec, --kv-store-mb, kept as store settings), neighbour-aware
precompute (--kv-neighbours), and the warning when a corpus's KV would not
fit.

  test_rag_kv.py --bin build/bin/rag_assistant --corpus tests/samples/fixtures/small_corpus
                 --model models/X.gguf
"""
import argparse
import fcntl
import os
import sys
import tempfile
import time

from rag_harness import Rag, check, describe, finish

QUESTION = "What is the name of the office cat in the office where Zofia Brandvold works?"


def ingest(rag, store, corpus, *extra):
    return rag.json(["--store", store, "ingest", corpus, "--chunk-tokens", "48", *extra])


def ask(rag, store):
    return rag.json(["--store", store, "ask", QUESTION, "--max-tokens", "2"])


def test_lazy(rag, corpus, tmp):
    store = os.path.join(tmp, "lazy")
    rc, obj, out, err = ingest(rag, store, corpus, "--kv", "lazy")
    ok = rc == 0 and obj and obj["kv_computed"] == 0 and obj["kv_pending"] == obj["chunks"] > 0
    check(ok, "ingest --kv lazy indexes the text and computes no KV", describe(rc, out, err))
    rc, first, out, err = ask(rag, store)
    check(rc == 0 and first and first["cache_misses"] > 0 and first["cache_hits"] == 0,
          "the first question computes its chunks' KV", describe(rc, out, err))
    rc, second, out, err = ask(rag, store)
    check(rc == 0 and second and second["cache_hits"] == first["cache_misses"]
          and second["cache_misses"] == 0,
          "and stores it: the same question again hits every chunk", describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "precompute"])
    n_left = obj["kv_pending"] - first["cache_misses"] if obj else -1
    check(rc == 0 and f"computed for {n_left} chunk(s)" in out,
          "precompute computes the rest", describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "precompute"])
    check(rc == 0 and "computed for 0 chunk(s)" in out, "and a second precompute has nothing to do",
          describe(rc, out, err))
    # One precompute per store: a held lock makes a second one say so.
    with open(os.path.join(store, "precompute.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rc, out, err = rag.run(["--store", store, "precompute"])
    check(rc == 0 and "already running" in out, "a precompute while another runs says so",
          describe(rc, out, err))


def test_background(rag, corpus, tmp):
    store = os.path.join(tmp, "background")
    rc, obj, out, err = ingest(rag, store, corpus, "--kv", "background")
    ok = rc == 0 and obj and obj["background_pid"] > 0 and obj["kv_computed"] == 0
    check(ok, "ingest --kv background returns at once with a precompute running",
          describe(rc, out, err))
    if not ok:
        return
    log = os.path.join(store, "precompute.log")
    deadline = time.time() + 240
    text = ""
    while time.time() < deadline:
        with open(log) as f:
            text = f.read()
        if "precompute: chunk KV computed" in text or "error" in text:
            break
        time.sleep(0.5)
    check(f"chunk KV computed for {obj['kv_pending']} chunk(s)" in text,
          "the background precompute computes every chunk, its progress in the log", text[-600:])
    rc, again, out, err = ingest(rag, store, corpus)
    check(rc == 0 and again and again["kv_computed"] == 0 and again["kv_pending"] == 0,
          "after it, nothing is left to compute", describe(rc, out, err))


def test_settings(rag, corpus, tmp):
    store = os.path.join(tmp, "q4")
    rc, q4, out, err = ingest(rag, store, corpus, "--kv-codec", "q4", "--kv-store-mb", "64")
    check(rc == 0 and q4 and q4["kv_codec"] == "q4" and q4["kv_capacity_bytes"] == 64 << 20,
          "--kv-codec and --kv-store-mb are applied", describe(rc, out, err))
    rc, again, out, err = ingest(rag, store, corpus)
    check(rc == 0 and again and again["kv_codec"] == "q4" and again["kv_computed"] == 0
          and again["kv_capacity_bytes"] == 64 << 20,
          "and kept as the store's settings (a re-ingest without them recomputes nothing)",
          describe(rc, out, err))
    rc, ans, out, err = ask(rag, store)
    check(rc == 0 and ans and ans["cache_misses"] == 0 and ans["cache_hits"] > 0,
          "ask opens the store with its codec (every chunk hits)", describe(rc, out, err))
    store8 = os.path.join(tmp, "q8")
    rc, q8, out, err = ingest(rag, store8, corpus)
    ok = rc == 0 and q8 and q4 and q8["kv_codec"] == "q8" and 0 < q4["kv_bytes"] < 0.8 * q8["kv_bytes"]
    check(ok, "q4 stores less than the default q8", describe(rc, out, err) +
          f"\n     q4 {q4 and q4['kv_bytes']} q8 {q8 and q8['kv_bytes']}")
    # f16 KV of this corpus is well over 16 MB with any of the test models.
    store16 = os.path.join(tmp, "f16")
    rc, out, err = rag.run(["--store", store16, "ingest", corpus, "--chunk-tokens", "48",
                            "--kv-codec", "f16", "--kv-store-mb", "16", "--kv", "lazy"])
    check(rc == 0 and "more than the store" not in err,
          "no capacity warning with --kv lazy", describe(rc, out, err))
    rc, out, err = rag.run(["--store", store16, "precompute"])
    check(rc == 0 and "more than the store's 16.0 MB" in err and "--kv-store-mb" in err,
          "a corpus whose KV exceeds the store is warned about, with its size",
          describe(rc, out, err))
    for args, what in ((["--kv", "sometimes"], "--kv with an unknown value"),
                       (["--kv-codec", "q3"], "--kv-codec with an unknown codec"),
                       (["--kv-store-mb", "0"], "--kv-store-mb 0")):
        rc, out, err = rag.run(["--store", store, "ingest", corpus] + args)
        check(rc == 2 and "error" in err, f"{what} is a usage error", describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "ask", QUESTION, "--kv", "lazy"])
    check(rc == 2 and "ingest" in err, "--kv is for ingest only", describe(rc, out, err))


def test_neighbours(rag, corpus, tmp):
    store = os.path.join(tmp, "neighbours")
    rc, obj, out, err = ingest(rag, store, corpus, "--kv-neighbours", "on", "--kv", "lazy")
    ok = rc == 0 and obj and obj["kv_neighbours"] and obj["kv_computed"] == 0 \
        and obj["kv_neighbour_pending"] == obj["chunks"] > 0
    check(ok, "ingest --kv-neighbours on --kv lazy leaves every chunk's neighbour KV pending",
          describe(rc, out, err))
    # A question computes its chunks' KV alone; the chunks after the first
    # look for their KV after a neighbour first and miss it.
    rc, first, out, err = ask(rag, store)
    n = len(first["sources"]) if first else 0
    ok = rc == 0 and n > 1 and first["cache_misses"] == n \
        and first["tiers"][0]["misses"] == 2 * n - 1
    check(ok, "a question looks for the KV after a neighbour of every chunk but the first",
          describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "precompute"])
    n_left = obj["chunks"] - n if obj else -1
    check(rc == 0 and f"computed for {n_left} chunk(s) alone and {obj['chunks']} after a neighbour"
          in out, "precompute computes the rest and every chunk's KV after its neighbour",
          describe(rc, out, err))
    rc, second, out, err = ask(rag, store)
    ok = rc == 0 and second and second["cache_misses"] == 0 \
        and second["tiers"][0]["misses"] == 0 and second["tiers"][0]["hits"] == n
    check(ok, "then the question finds each chunk's KV with one lookup", describe(rc, out, err))
    rc, info, out, err = rag.json(["--store", store, "status"])
    ok = rc == 0 and info and info["kv_neighbours"] and info["kv_entries"] == 2 * info["chunks"]
    check(ok, "info shows the setting, and the store holds two KV entries per chunk",
          describe(rc, out, err))
    rc, again, out, err = ingest(rag, store, corpus, "--kv-neighbours", "off")
    ok = rc == 0 and again and not again["kv_neighbours"] and again["kv_computed"] == 0 \
        and again["kv_neighbour_computed"] == 0
    check(ok, "--kv-neighbours off is kept as the store's setting", describe(rc, out, err))
    rc, third, out, err = ask(rag, store)
    ok = rc == 0 and third and third["tiers"][0]["misses"] == 0 \
        and third["tiers"][0]["hits"] == len(third["sources"])
    check(ok, "and questions then take the KV computed alone", describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "ingest", corpus, "--kv-neighbours", "yes"])
    check(rc == 2 and "--kv-neighbours" in err, "--kv-neighbours takes on or off",
          describe(rc, out, err))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model")
    a = ap.parse_args()
    rag = Rag(a.bin, a.model)
    with tempfile.TemporaryDirectory() as tmp:
        test_lazy(rag, a.corpus, tmp)
        test_background(rag, a.corpus, tmp)
        test_settings(rag, a.corpus, tmp)
        test_neighbours(rag, a.corpus, tmp)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
