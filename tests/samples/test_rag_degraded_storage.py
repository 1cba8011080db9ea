#!/usr/bin/env python3
"""rag_assistant on degraded storage, end to end.

  test_rag_degraded_storage.py --bin build/bin/rag_assistant
                               --corpus tests/samples/fixtures/small_corpus [--model models/X.gguf]

$CB_MODEL, when set, overrides --model.  After one ingest, `ask` must still
answer (exit 0, every chunk from the store) and say what is wrong on stderr
when:

  * --slow-dir names a file, not a directory (an SD card gone, a mount point
    replaced): the slow tier is skipped with a warning;
  * the disk is full (a file size limit of 0: no file can grow, so SQLite
    cannot make the -shm it needs to read a WAL database): the corpus
    database and the chunk store open read-only, with a warning each, with
    and without tiers (whose placement reads the calibration database);
  * the store belongs to another user (as root: the program runs as user
    nobody; otherwise the store is made read-only): the same;
  * the chunk store's index no longer lists its blobs (removed, or another
    store's index or -wal copied in): the blobs are quarantined, and the
    warning says how many and how to get them back; the next ingest
    computes them again.

Prints "N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from rag_harness import check, describe, finish


QUESTION = "What is the name of the office cat in the office where Zofia Brandvold works?"
CHUNK_TOKENS = "48"
THREADS = "2"


def full_disk():
    """In the child: no file may grow (EFBIG, as ENOSPC on a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))


class Rag:
    def __init__(self, binary, model):
        self.binary = binary
        self.env = dict(os.environ)
        self.env.pop("CB_MODEL", None)
        self.model = ["--model", model] if model else []

    def run(self, args, preexec_fn=None, user=None):
        p = subprocess.run([self.binary] + self.model + ["--threads", THREADS] + args,
                           capture_output=True, timeout=300, env=self.env,
                           preexec_fn=preexec_fn, user=user)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    def ask(self, store, extra=(), preexec_fn=None, user=None):
        rc, out, err = self.run(["--store", store, "ask", QUESTION, "--json"] + list(extra),
                                preexec_fn=preexec_fn, user=user)
        try:
            obj = json.loads(out) if rc == 0 else None
        except ValueError:
            obj = None
        return rc, obj, out, err


def warnings(err):
    return [l for l in err.splitlines() if l.startswith("rag_assistant: warning: ")]


def served_from_store(o):
    return o is not None and o.get("cache_hits", 0) > 0 and o.get("cache_misses") == 0


def test_slow_dir_not_a_directory(rag, store, tmp):
    not_a_dir = os.path.join(tmp, "sdcard")
    with open(not_a_dir, "w") as f:
        f.write("not a directory\n")
    rc, o, out, err = rag.ask(store, ["--slow-dir", not_a_dir])
    check(rc == 0 and served_from_store(o), "a slow dir that is a file: ask answers from flash",
          describe(rc, out, err))
    check(any("slow tier" in w and not_a_dir in w and "unavailable" in w for w in warnings(err)),
          "a slow dir that is a file: a warning names it", describe(rc, out, err))


def test_full_disk(rag, store):
    for suffix in ("-wal", "-shm"):
        for db in ("corpus.sqlite", "kv/index.sqlite"):
            check(not os.path.exists(os.path.join(store, db + suffix)),
                  f"closed cleanly: no {db}{suffix}")
    rc, o, out, err = rag.ask(store, preexec_fn=full_disk)
    check(rc == 0 and served_from_store(o), "full disk: ask answers from the store",
          describe(rc, out, err))
    w = warnings(err)
    check(any("corpus database" in l and "read-only" in l for l in w),
          "full disk: a warning says the corpus database is read-only", describe(rc, out, err))
    check(any("chunk store" in l and "read-only" in l for l in w),
          "full disk: a warning says the chunk store is read-only", describe(rc, out, err))
    # With tiers, placement needs the model's compute cost, kept in
    # DIR/kv/calibration.sqlite (written by the first ask with tiers).
    rc, o, out, err = rag.ask(store, ["--ram-budget-mb", "64"])
    check(rc == 0 and os.path.exists(os.path.join(store, "kv", "calibration.sqlite")),
          "tiers: the calibration is kept beside the store", describe(rc, out, err))
    rc, o, out, err = rag.ask(store, ["--ram-budget-mb", "64"], preexec_fn=full_disk)
    check(rc == 0 and served_from_store(o), "full disk, with tiers: ask answers from the store",
          describe(rc, out, err))


def test_store_of_another_user(rag, store):
    if os.geteuid() == 0:
        user, restore = 65534, None  # nobody: may read the store, not write it
    else:
        user = None
        modes = {}
        for root, dirs, files in os.walk(store):
            for p in [root] + [os.path.join(root, f) for f in files]:
                modes[p] = os.stat(p).st_mode
                os.chmod(p, modes[p] & ~0o222)
        restore = modes
    try:
        rc, o, out, err = rag.ask(store, user=user)
    finally:
        for p, mode in (restore or {}).items():
            os.chmod(p, mode)
    check(rc == 0 and served_from_store(o), "a store that cannot be written: ask answers from it",
          describe(rc, out, err))
    check(sum("read-only" in l for l in warnings(err)) == 2,
          "a store that cannot be written: both databases say read-only", describe(rc, out, err))


def test_quarantine(rag, store, corpus):
    kv = os.path.join(store, "kv")
    blobs = [f for f in os.listdir(os.path.join(kv, "blobs")) if f.endswith(".kv")]
    for suffix in ("", "-wal", "-shm"):
        path = os.path.join(kv, "index.sqlite" + suffix)
        if os.path.exists(path):
            os.remove(path)
    rc, o, out, err = rag.ask(store)
    check(rc == 0 and o is not None and o.get("cache_hits") == 0,
          "an index without the blobs: ask answers by computing", describe(rc, out, err))
    w = warnings(err)
    check(len(blobs) > 8 and any(f"{len(blobs)} chunk(s)" in l and "quarantine" in l
                                 and "to get them back" in l for l in w),
          f"an index without the blobs: the warning says {len(blobs)} chunks were quarantined "
          "and how to get them back", describe(rc, out, err))
    check(any("ingest" in l for l in w), "an index without the blobs: the warning names ingest",
          describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "ingest", corpus, "--chunk-tokens", CHUNK_TOKENS])
    rc, o, out, err = rag.ask(store)
    check(rc == 0 and served_from_store(o) and not warnings(err),
          "after ingest: every chunk from the store again, no warning", describe(rc, out, err))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model", default="")
    args = ap.parse_args()
    model = os.environ.get("CB_MODEL") or args.model
    rag = Rag(args.bin, model)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # user nobody reads the store
        store = os.path.join(tmp, "store")
        rc, out, err = rag.run(["--store", store, "ingest", args.corpus,
                                "--chunk-tokens", CHUNK_TOKENS])
        check(rc == 0, "ingest", describe(rc, out, err))
        if rc == 0:
            test_slow_dir_not_a_directory(rag, store, tmp)
            test_full_disk(rag, store)
            test_store_of_another_user(rag, store)
            test_quarantine(rag, store, args.corpus)
    return finish(f" ({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
