#!/usr/bin/env python3
"""End-to-end test of rag_assistant on the demo corpus.

  test_rag_assistant.py --bin build/bin/rag_assistant --corpus tests/samples/fixtures/small_corpus
                        [--model models/X.gguf]

$CB_MODEL, when set, overrides --model.  In a temporary store: ingest (and
that re-ingest does no work, a changed file is re-chunked, --prune drops a
deleted one), a two-document question answered right with --mode blend and
--mode full with blend's TTFT below full's, answers served from the chunk
cache, chat over a pipe and Ctrl-C during an answer, the relevance floor (a
question nothing in the store is about: "I could not find this in your
documents.", no sources, no model run, exit status 3), ask --retrieve-only
and ingest --kv lazy, and that every user error (no store, empty corpus,
binary or unreadable files, bad flags) gives one clear "rag_assistant:
error: " line and exit status 1 (2 for usage errors).  Prints "N passed, N failed"; exit status 1 on
any failure.
"""
import argparse
import json
import os
import pty
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import rag_harness
from rag_harness import check, describe, finish


# A small corpus of short declarative paragraphs (tests/samples/fixtures/
# small_corpus), which the 135M test model reads well.  Both hops are needed:
# people.md says where Zofia Brandvold works, offices.md which office has a
# cat and its name; the 135M model answers it right in both modes.
QUESTION = "What is the name of the office cat in the office where Zofia Brandvold works?"
ANSWER = "Mochi"
CHUNK_TOKENS = "48"  # paragraph-sized chunks: what the 135M model reads well
THREADS = "2"        # the same for every timed run


class Rag(rag_harness.Rag):
    def __init__(self, binary, model):
        super().__init__(binary, model, THREADS)

    def expect_error(self, args, what, code=1, must_contain=(), stdin=None, user=None):
        rc, out, err = self.run(args, stdin=stdin, user=user)
        errors = [l for l in err.splitlines() if l.startswith("rag_assistant: error: ")]
        ok = (rc == code and len(errors) == 1
              and all(m.lower() in err.lower() for m in must_contain))
        check(ok, what, describe(rc, out, err))


def test_errors_before_ingest(rag, tmp):
    store = os.path.join(tmp, "store")
    rag.expect_error(["--store", os.path.join(tmp, "nowhere"), "ask", "Who is Mochi?"],
                     "ask before any ingest", must_contain=["ingest"])
    empty = os.path.join(tmp, "empty_dir")
    os.makedirs(os.path.join(empty, "sub"))
    with open(os.path.join(empty, "picture.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
    rag.expect_error(["--store", store, "ingest", empty], "ingest of a folder without text files",
                     must_contain=["empty corpus"])
    binary = os.path.join(tmp, "blob.md")
    with open(binary, "wb") as f:
        f.write(b"# looks like text\n\x00\x01\x02\xff binary after all")
    rag.expect_error(["--store", store, "ingest", binary], "ingest of a binary file only",
                     must_contain=["binary", "nothing to ingest"])
    rag.expect_error(["--store", store, "ingest", os.path.join(tmp, "absent.md")],
                     "ingest of a missing file", must_contain=["absent.md", "nothing to ingest"])
    fresh = os.path.join(tmp, "fresh_store")
    rag.expect_error(["--store", fresh, "ingest", os.path.join(tmp, "absent.md")],
                     "first ingest of a missing file", must_contain=["nothing to ingest"])
    check(not os.path.exists(os.path.join(fresh, "corpus.sqlite")),
          "a first ingest that fails leaves no store behind", str(os.listdir(tmp)))
    # An unreadable file.  Root reads any file, so as root the program runs
    # as user nobody, in a folder that user may write to.
    shared = os.path.join(tmp, "shared")
    os.makedirs(shared)
    os.chmod(tmp, 0o755)
    os.chmod(shared, 0o777)
    locked = os.path.join(shared, "locked.md")
    with open(locked, "w") as f:
        f.write("Secret text.\n")
    os.chmod(locked, 0)
    rag.expect_error(["--store", os.path.join(shared, "store"), "ingest", locked],
                     "ingest of an unreadable file", must_contain=["cannot read", "nothing to ingest"],
                     user=65534 if os.geteuid() == 0 else None)
    # A folder's symbolic link to a file outside it is skipped, with a
    # warning; one to a file inside it is followed.
    linked = os.path.join(tmp, "linked")
    os.makedirs(linked)
    with open(os.path.join(tmp, "secret.md"), "w") as f:
        f.write("# Secret\n\nThe password is swordfish.\n")
    with open(os.path.join(linked, "inside.md"), "w") as f:
        f.write("# Inside\n\nThe office plant is a fern named Gerald.\n")
    os.symlink(os.path.join(tmp, "secret.md"), os.path.join(linked, "escape.md"))
    os.symlink(os.path.join(linked, "inside.md"), os.path.join(linked, "alias.md"))
    link_store = os.path.join(tmp, "link_store")
    rc, out, err = rag.run(["--store", link_store, "ingest", linked])
    with sqlite3.connect(os.path.join(link_store, "corpus.sqlite")) as db:
        paths = sorted(os.path.basename(r[0]) for r in db.execute("SELECT path FROM files"))
    check(rc == 0 and "escape.md" in err and "outside" in err and paths == ["inside.md"],
          "a symlink out of the folder is skipped with a warning", describe(rc, out, err) + str(paths))

    # The failed first ingests created no store; one whose only file was
    # deleted and pruned is an empty store.
    rag.expect_error(["--store", store, "ask", QUESTION], "ask after failed first ingests",
                     must_contain=["no corpus", "ingest"])
    gone = os.path.join(tmp, "gone.md")
    with open(gone, "w") as f:
        f.write("# Gone\n\nThis file will be deleted.\n")
    rc, out, err = rag.run(["--store", store, "ingest", gone])
    os.remove(gone)
    rag.run(["--store", store, "ingest", gone, "--prune"])
    rag.expect_error(["--store", store, "ask", QUESTION], "ask on an empty store",
                     must_contain=["no documents"])
    # Usage errors (exit status 2).
    rag.expect_error(["--store", store, "ask", QUESTION, "--mode", "fast"], "ask --mode fast",
                     code=2, must_contain=["--mode"])
    rag.expect_error(["--store", store, "ask", QUESTION, "--ratio", "1.5"], "ask --ratio 1.5",
                     code=2, must_contain=["[0, 1]"])
    rag.expect_error(["--store", store, "ask", QUESTION, "--mode", "full", "--ratio", "auto"],
                     "ask --ratio with --mode full", code=2, must_contain=["blend"])
    rag.expect_error(["--store", store, "ask", QUESTION, "--chunk-shift", "maybe"],
                     "ask --chunk-shift maybe", code=2, must_contain=["--chunk-shift"])
    rag.expect_error(["--store", store, "ask", QUESTION, "--mode", "full", "--chunk-shift", "off"],
                     "ask --chunk-shift with --mode full", code=2, must_contain=["blend"])
    rag.expect_error(["ask", QUESTION], "no --store", code=2, must_contain=["--store"])
    # Without PATH ingest takes the store's own files: here there are none.
    rag.expect_error(["--store", store, "ingest"], "ingest without paths into a store without files",
                     must_contain=["ingest"])
    rag.expect_error(["--store", store, "ask"], "ask without a question", code=2)
    rag.expect_error(["--store", store, "fly"], "unknown command", code=2, must_contain=["fly"])


def test_ingest(rag, store, corpus):
    n_files = len([f for f in os.listdir(corpus) if f.endswith((".md", ".txt"))])
    t0 = time.monotonic()
    rc, o, out, err = rag.json(["--store", store, "ingest", corpus, "--chunk-tokens", CHUNK_TOKENS])
    print(f"     first ingest took {time.monotonic() - t0:.1f} s")
    ok = (o is not None and o.get("files_new") == n_files and o.get("chunks", 0) > n_files
          and o.get("kv_computed") == o.get("chunks") and o.get("files_skipped") == 0)
    check(ok, "ingest: every file chunked, every chunk's KV precomputed", describe(rc, out, err))
    check("precomputing chunk KV" in err and f"{o and o.get('chunks')}/" in err,
          "ingest: progress on stderr (plain lines when not a terminal)", err[-400:])
    chunks = o.get("chunks") if o else None

    rc, o, out, err = rag.json(["--store", store, "ingest", corpus, "--chunk-tokens", CHUNK_TOKENS])
    check(o is not None and o.get("files_unchanged") == n_files and o.get("files_new") == 0
          and o.get("files_changed") == 0 and o.get("kv_computed") == 0
          and o.get("chunks") == chunks and "precomputing" not in err,
          "re-ingest of unchanged files does no work", describe(rc, out, err))
    # Without --chunk-tokens the store's own chunk length is used.
    rc, o, out, err = rag.json(["--store", store, "ingest", corpus])
    check(o is not None and o.get("files_unchanged") == n_files and o.get("kv_computed") == 0
          and "re-chunking" not in err,
          "re-ingest without --chunk-tokens keeps the store's chunk length", describe(rc, out, err))
    # A file over --max-file-mb is skipped with a warning, before it is read.
    big = os.path.join(os.path.dirname(corpus), "big.txt")
    with open(big, "w") as f:
        f.write("lorem ipsum " * 100000)  # 1.2 MB
    rc, o, out, err = rag.json(["--store", store, "ingest", big, "--max-file-mb", "1"])
    check(rc == 1 and "big.txt" in err and "--max-file-mb" in err and "nothing to ingest" in err,
          "a file over --max-file-mb is skipped with a warning", describe(rc, out, err))
    # A first ingest that finds nothing usable leaves no store.
    fresh = os.path.join(os.path.dirname(corpus), "fresh-store")
    rc, out, err = rag.run(["--store", fresh, "ingest", big, "--max-file-mb", "1"])
    check(rc == 1 and not os.path.exists(fresh), "a failed first ingest leaves no store",
          describe(rc, out, err))
    return chunks


def ask(rag, store, mode, top_k=None, extra=()):
    extra = (["--top-k", str(top_k)] if top_k else []) + list(extra)
    rc, o, out, err = rag.json(["--store", store, "ask", QUESTION, "--mode", mode,
                                "--max-tokens", "40"] + extra)
    check(o is not None and all(k in o for k in ("answer", "ttft_ms", "ratio", "mode", "sources",
                                                 "cache_hits", "cache_misses"))
          and o.get("found") is True and o.get("relevance", 0) >= 0.5,
          f"ask --mode {mode} --json: one object with the contract's fields",
          describe(rc, out, err))
    return o or {}


def test_ask(rag, store):
    blend = ask(rag, store, "blend")
    full = ask(rag, store, "full")
    for name, o in (("blend", blend), ("full", full)):
        check(ANSWER.lower() in o.get("answer", "").lower(),
              f"{name}: the two-document question answered ({ANSWER})", repr(o.get("answer")))
    files = {s.get("file", "").split("/")[-1] for s in blend.get("sources", [])}
    check({"people.md", "offices.md"} <= files, "retrieval brings both documents", str(files))
    check(blend.get("mode") == "blend" and abs(blend.get("ratio", 0) - 0.2) < 1e-6
          and blend.get("select") == "lookahead" and blend.get("chunk_shift") is True
          and full.get("mode") == "full" and full.get("ratio") == 1
          and "chunk_shift" in full and full.get("chunk_shift") is None,
          "mode, ratio and chunk shift reported", f"{blend} {full}")
    unshifted = ask(rag, store, "blend", extra=["--chunk-shift", "off"])
    check(unshifted.get("chunk_shift") is False
          and ANSWER.lower() in unshifted.get("answer", "").lower(),
          "ask --chunk-shift off: answered, and reported off", str(unshifted))
    check(blend.get("cache_misses") == 0 and blend.get("cache_hits") == len(blend.get("sources", [])),
          "blend: every chunk's KV came from the store (precomputed at ingest)", str(blend))

    # A second ask: the request is served entirely from the chunk cache.
    again = ask(rag, store, "blend")
    check(again.get("cache_misses") == 0 and again.get("cache_hits", 0) > 0
          and again.get("answer") == blend.get("answer"),
          "second ask: served from the cache, same answer", str(again))

    # TTFT, same request, same thread count, on a request of 8 chunks
    # (about 400 tokens): blend reuses every chunk's KV and recomputes a
    # fifth of its tokens after a cheap reuse pass, about 0.6 of full
    # prefill's time here.  (The 3-chunk request above, about 170 tokens, is
    # too short for the method: there its fixed costs match the int8 full
    # prefill's.)  A busy machine only slows runs down, so the best of two
    # runs of each are compared, and when another test's burst made that
    # inconclusive, the best of two more of each.
    t_blend = min(ask(rag, store, "blend", 8).get("ttft_ms", 1e9) for _ in range(2))
    long_full = [ask(rag, store, "full", 8) for _ in range(2)]
    t_full = min(o.get("ttft_ms", 0) for o in long_full)
    if not 0 < t_blend < t_full:
        for _ in range(2):
            t_blend = min(t_blend, ask(rag, store, "blend", 8).get("ttft_ms", 1e9))
            t_full = min(t_full, ask(rag, store, "full", 8).get("ttft_ms", 1e9))
    print(f"     ttft_ms blend {t_blend:.1f}, full {t_full:.1f} "
          f"({long_full[0].get('n_ctx')} request tokens)")
    check(0 < t_blend < t_full, "blend's TTFT is below full prefill's",
          f"blend {t_blend} ms, full {t_full} ms")

    # The text report.
    rc, out, err = rag.run(["--store", store, "ask", QUESTION])
    check(rc == 0 and ANSWER.lower() in out.lower() and "TTFT" in out and "sources:" in out
          and "people.md" in out and "hit(s)" in out, "ask: streamed answer and report",
          describe(rc, out, err))
    # Auto ratio: the loading controller's pick (never below 0.15).
    rc, o, out, err = rag.json(["--store", store, "ask", QUESTION, "--ratio", "auto"])
    check(o is not None and o.get("ratio_mode") == "auto" and 0.15 <= o.get("ratio", 0) <= 1,
          "ask --ratio auto", describe(rc, out, err))
    # FTS5 syntax in a question is only text.
    rc, o, out, err = rag.json(["--store", store, "ask", 'cat" OR NEAR(( * -Mochi AND', "--top-k",
                                "1", "--max-tokens", "4"])
    check(rc == 0 and o is not None and o.get("sources"),
          "FTS5 syntax in a question never reaches the user", describe(rc, out, err))


NOT_FOUND = "I could not find this in your documents."
# Shares only common words ("office", "employees") with the corpus.
UNRELATED = "Which office has a swimming pool for the employees?"


def test_relevance_floor(rag, store):
    for q, what in (("xylophone quasar zeppelin?", "no word in the corpus"),
                    (UNRELATED, "only common words in the corpus")):
        rc, out, err = rag.run(["--store", store, "ask", q])
        check(rc == 3 and out.startswith(NOT_FOUND + "\n") and "sources:" not in out
              and "TTFT" not in out and "error" not in err,
              f"a question about nothing in the store ({what}): exit 3, could not find, "
              "no sources, no model run", describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "ask", UNRELATED, "--json"])
    try:
        o = json.loads(out)
    except ValueError:
        o = {}
    check(rc == 3 and o.get("found") is False and o.get("sources") == []
          and o.get("answer") == NOT_FOUND and 0 < o.get("relevance", 1) < 0.5,
          "ask --json: found false, no sources", describe(rc, out, err))
    # The floor off: the same question gets its BM25 chunks and an answer.
    rc, o, out, err = rag.json(["--store", store, "ask", UNRELATED, "--min-relevance", "0",
                                "--max-tokens", "4"])
    check(rc == 0 and o is not None and o.get("found") is True and o.get("sources"),
          "--min-relevance 0 turns the floor off", describe(rc, out, err))

    # Retrieval alone: no model is loaded (a model path that does not exist
    # is never opened).
    no_model = [rag.binary, "--model", "/nonexistent/model.gguf", "--store", store]
    p = subprocess.run(no_model + ["ask", QUESTION, "--retrieve-only"], capture_output=True,
                       text=True, env=rag.env)
    check(p.returncode == 0 and p.stdout.startswith("[1] ") and "people.md" in p.stdout
          and "relevance" in p.stdout and "TTFT" not in p.stdout,
          "ask --retrieve-only: ranked sources, no model", describe(p.returncode, p.stdout,
                                                                     p.stderr))
    p = subprocess.run(no_model + ["ask", UNRELATED, "--retrieve-only", "--json"],
                       capture_output=True, text=True, env=rag.env)
    try:
        o = json.loads(p.stdout)
    except ValueError:
        o = {}
    check(p.returncode == 3 and o.get("found") is False and o.get("sources") == [],
          "ask --retrieve-only --json on an unrelated question: exit 3, found false",
          describe(p.returncode, p.stdout, p.stderr))
    # The per-file cap: with --top-k 4 at most two chunks of one file while
    # other files match (plain BM25 gives projects.md three or more here).
    def files_of(extra):
        p = subprocess.run(no_model + ["ask", "Who leads the projects and where are the offices?",
                                       "--retrieve-only", "--json", "--top-k", "4"] + extra,
                           capture_output=True, text=True, env=rag.env)
        try:
            return [s["file"] for s in json.loads(p.stdout).get("sources", [])], p
        except ValueError:
            return [], p
    capped, p = files_of([])
    plain, _ = files_of(["--no-diversity"])
    check(len(capped) == 4 and max(capped.count(f) for f in capped) <= 2
          and max(plain.count(f) for f in plain or [""]) > 2,
          "at most half the slots go to one file (--no-diversity: plain BM25)",
          f"capped {capped}, plain {plain}; " + describe(p.returncode, p.stdout, p.stderr))
    rag.expect_error(["--store", store, "ask", QUESTION, "--min-relevance", "1.5"],
                     "ask --min-relevance 1.5", code=2, must_contain=["--min-relevance"])
    rag.expect_error(["--store", store, "chat", "--retrieve-only"], "chat --retrieve-only",
                     code=2, must_contain=["--retrieve-only"])


def test_lazy_ingest(rag, tmp, corpus):
    store = os.path.join(tmp, "lazy_store")
    one = os.path.join(corpus, "offices.md")
    rc, o, out, err = rag.json(["--store", store, "ingest", one, "--kv", "lazy",
                                "--chunk-tokens", CHUNK_TOKENS])
    check(o is not None and o.get("chunks", 0) > 0 and o.get("kv_computed") == 0
          and "precomputing" not in err, "ingest --kv lazy: chunks indexed, no KV",
          describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "ask", "Where does the office cat sleep?",
                            "--retrieve-only"])
    check(rc == 0 and "offices.md" in out, "ask --retrieve-only on a store without KV",
          describe(rc, out, err))
    rc, o2, out, err = rag.json(["--store", store, "ingest", one])
    check(o2 is not None and o and o2.get("kv_computed") == o.get("chunks"),
          "a later ingest computes the KV a lazy ingest left out", describe(rc, out, err))


def test_chat(rag, store):
    rc, out, err = rag.run(["--store", store, "chat", "--max-tokens", "48"],
                           stdin=(QUESTION + "\n\nxylophone quasar\nWho leads Project Kestrel?\n")
                           .encode())
    check(rc == 0 and out.count("TTFT") == 2 and NOT_FOUND in out and ANSWER in out,
          "chat over a pipe: two answers, a could-not-find notice, exit at EOF",
          describe(rc, out, err))

    # A question too long for the context: its error, then the next question
    # is answered.
    too_long = "Who leads Project Kestrel? " + "kestrel " * 9000
    rc, out, err = rag.run(["--store", store, "chat", "--max-tokens", "48"],
                           stdin=(too_long + "\n" + QUESTION + "\n").encode())
    check(rc == 0 and "error:" in err and "do not fit the context" in err
          and out.count("TTFT") == 1 and ANSWER in out,
          "chat: a question that does not fit is an error, not the end", describe(rc, out, err))

    # Ctrl-C during an answer stops that answer only; the next is answered.
    p = subprocess.Popen([rag.binary] + rag.model + ["--threads", THREADS, "--store", store, "chat",
                          "--max-tokens", "4000", "--mode", "reuse", "--min-relevance", "0"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=rag.env)
    p.stdin.write(b"Tell me everything about every project, every office and every person.\n")
    p.stdin.flush()
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(seen) < 2:
        b = p.stdout.read1(1)
        if not b:
            break
        seen += b
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(input=(QUESTION + "\n").encode(), timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    out = (seen + out).decode("utf-8", "replace")
    err = err.decode("utf-8", "replace")
    check(p.returncode == 0 and "[stopped]" in out and "(cancelled)" in out
          and out.count("TTFT") == 2, "chat: Ctrl-C stops the answer, not the program",
          describe(p.returncode, out, err))


def test_chat_at_a_terminal(rag, store):
    # At a terminal: the line can be edited (arrow keys move the cursor) and
    # the history recalls the last question; Ctrl-C at the prompt exits.
    # Its own session: libedit passes Ctrl-C on to the whole process group.
    master, slave = pty.openpty()
    p = subprocess.Popen([rag.binary] + rag.model + ["--threads", THREADS, "--store", store, "chat",
                          "--max-tokens", "24"], stdin=slave, stdout=subprocess.PIPE,
                         stderr=slave, env=rag.env, start_new_session=True)
    os.close(slave)
    seen = b""

    def read_until(marker, seconds):
        nonlocal seen
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and seen.count(b"\n> ") < marker:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break

    read_until(1, 120)
    left = b"\x1b[D" * len("office where Zofia Brandvold works?")
    typed = QUESTION.replace("office cat in the ", "")
    os.write(master, typed.encode() + left + b"office cat in the " + b"\r")
    read_until(2, 120)
    os.write(master, b"\x1b[A\r")  # the previous question again
    read_until(3, 120)
    p.send_signal(signal.SIGINT)
    try:
        out, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    os.close(master)
    out = out.decode("utf-8", "replace")
    edited = (QUESTION.encode() in seen.replace(b"\r", b""))
    check(p.returncode == 0 and out.count("TTFT") == 2 and out.count(ANSWER) >= 2 and edited,
          "chat at a terminal: line editing, history, Ctrl-C at the prompt exits",
          describe(p.returncode, out, seen.decode("utf-8", "replace")[-600:]))


def test_updates(rag, store, corpus):
    # A changed file replaces its chunks (and only its KV is computed); a
    # deleted one stays until --prune.
    with open(os.path.join(corpus, "projects.md"), "a") as f:
        f.write("\n## Lunch\n\nLunch is served at noon in the Fjord Room on Fridays.\n")
    os.remove(os.path.join(corpus, "old.txt"))
    rc, o, out, err = rag.json(["--store", store, "ingest", corpus, "--chunk-tokens", CHUNK_TOKENS])
    check(o is not None and o.get("files_changed") == 1 and o.get("files_removed") == 0
          and 0 < o.get("kv_computed", 0) <= 2, "a changed file is re-chunked, the rest untouched",
          describe(rc, out, err))
    check("still answered from" in err and "old.txt" in err and "--prune" in err,
          "ingest warns about a deleted file that is still served", describe(rc, out, err))
    rc, o, out, err = rag.json(["--store", store, "ask", "When was the old intranet switched off?",
                                "--top-k", "1", "--max-tokens", "4"])
    check(rc == 0 and "old.txt" in err and "deleted" in err,
          "ask names a deleted source on stderr", describe(rc, out, err))
    rc, o, out, err = rag.json(["--store", store, "ingest", corpus, "--chunk-tokens", CHUNK_TOKENS,
                                "--prune"])
    check(o is not None and o.get("files_removed") == 1 and o.get("kv_computed") == 0,
          "--prune drops a deleted file", describe(rc, out, err))
    check(o is not None and o.get("kv_removed") == 1,
          "--prune drops the deleted file's chunk KV too", describe(rc, out, err))
    rc, o, out, err = rag.json(["--store", store, "ask", "When is lunch served on Fridays?",
                                "--top-k", "1", "--max-tokens", "8"])
    check(o is not None and o.get("sources", [{}])[0].get("file", "").endswith("projects.md")
          and o.get("cache_misses") == 0, "the new text is retrieved, its KV cached",
          describe(rc, out, err))
    # A binary file among good ones: skipped with a warning, not an error.
    with open(os.path.join(corpus, "diagram.md"), "wb") as f:
        f.write(b"\x00\x10 binary")
    rc, o, out, err = rag.json(["--store", store, "ingest", corpus, "--chunk-tokens", CHUNK_TOKENS])
    check(rc == 0 and o is not None and o.get("files_skipped") == 1
          and "warning" in err and "diagram.md" in err, "a binary file is skipped with a warning",
          describe(rc, out, err))


def test_untrusted_file_names(rag, tmp, corpus_dir):
    """File names are printed escaped: a newline in one cannot forge an
    output line, and no escape sequence reaches the terminal."""
    odd = os.path.join(tmp, "odd_names")
    os.makedirs(odd)
    forged = "note\nrag_assistant: error: forged\x1b[2J\u009b31m.md"
    open(os.path.join(odd, "empty" + forged), "w").close()
    shutil.copy(os.path.join(corpus_dir, "people.md"), os.path.join(odd, "people" + forged))
    store = os.path.join(tmp, "odd_store")
    rc, out, err = rag.run(["--store", store, "ingest", odd, "--chunk-tokens", CHUNK_TOKENS])
    lines = err.splitlines()
    check(rc == 0 and any(l.startswith("rag_assistant: warning: skipping ") and "empty" in l
                          and "note\\x0arag_assistant: error: forged\\x1b[2J\\xc2\\x9b31m.md" in l
                          for l in lines)
          and not any(l.startswith("rag_assistant: error") for l in lines)
          and "\x1b" not in err and "\u009b" not in err,
          "ingest warnings print file names escaped", describe(rc, out, err))
    rc, out, err = rag.run(["--store", store, "ask", QUESTION, "--max-tokens", "8"])
    sources = [l for l in out.splitlines() if l.startswith("sources:")]
    check(rc == 0 and len(sources) == 1 and "peoplenote\\x0arag_assistant" in sources[0]
          and not any(l.startswith("rag_assistant: error") for l in out.splitlines())
          and "\x1b" not in out and "\u009b" not in out,
          "the sources line prints file names escaped", describe(rc, out, err))


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
        test_errors_before_ingest(rag, tmp)
        test_untrusted_file_names(rag, tmp, args.corpus)
        # The files the questions read, and a small one to delete later:
        # a smaller ingest keeps the test quick under ASan.
        corpus = os.path.join(tmp, "corpus")
        os.makedirs(corpus)
        for name in ("people.md", "offices.md", "projects.md"):
            shutil.copy(os.path.join(args.corpus, name), corpus)
        with open(os.path.join(corpus, "old.txt"), "w") as f:
            f.write("The old intranet was switched off in 2019.\n")
        store = os.path.join(tmp, "store")
        test_ingest(rag, store, corpus)
        test_ask(rag, store)
        test_relevance_floor(rag, store)
        test_lazy_ingest(rag, tmp, corpus)
        test_chat(rag, store)
        test_chat_at_a_terminal(rag, store)
        test_updates(rag, store, corpus)
    return finish(f" ({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
