#!/usr/bin/env python3
"""End-to-end test of rag_assistant's store management.

  test_rag_manage.py --bin build/bin/rag_assistant --corpus tests/samples/fixtures/small_corpus
                     --model models/SmolLM2-135M-Instruct.Q4_1.gguf
                     --other-model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

In a temporary store: --version without a store; list and status (text and
--json) after an ingest; remove of a path that names no stored file fails
with exit status 1 and changes nothing; remove by path and by name drops the
files and their chunks' KV, and ask no longer cites them; ingest --system
records the system prompt and recomputes every chunk, ask uses it, and ask
--system with another warns once and still answers; asking with another
model warns that every chunk is recomputed, and ingest with it records a
second model; without --model a command loads the model of the store's
last ingest, and the default model once that file is gone.  Prints "N
passed, N failed"; exit status 1 on any failure.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from rag_harness import check, describe, finish


CHUNK_TOKENS = "48"
THREADS = "2"
# people.md says where Zofia Brandvold works: retrieval cites it.
QUESTION = "Where does Zofia Brandvold work?"
DEFAULT_SYSTEM = "Answer the question using the documents."


class Rag:
    def __init__(self, binary, model, store):
        self.binary = binary
        self.model = model
        self.store = store
        self.env = dict(os.environ)
        self.env.pop("CB_MODEL", None)

    def run(self, args, model=None, store=True):
        """model: None for the test's model, "" for no --model at all."""
        cmd = [self.binary] + ([] if model == "" else ["--model", model or self.model])
        cmd += ["--threads", THREADS]
        if store:
            cmd += ["--store", self.store]
        p = subprocess.run(cmd + args, capture_output=True, timeout=300, env=self.env)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    def json(self, args, model=None):
        rc, out, err = self.run(args + ["--json"], model=model)
        try:
            obj = json.loads(out) if rc == 0 else None
        except ValueError:
            obj = None
        return rc, obj, out, err


def warnings(err, text):
    return [l for l in err.splitlines()
            if l.startswith("rag_assistant: warning: ") and text in l]


def test_version(rag):
    p = subprocess.run([rag.binary, "--version"], capture_output=True, text=True, timeout=60)
    lines = p.stdout.splitlines()
    check(p.returncode == 0 and len(lines) == 2
          and re.fullmatch(r"rag_assistant \d+\.\d+\.\d+", lines[0]) is not None
          and re.fullmatch(r"libcacheblend \d+\.\d+\.\d+", lines[1]) is not None,
          "--version prints rag_assistant's and the library's version without --store",
          describe(p.returncode, p.stdout, p.stderr))


def test_list_and_status(rag, corpus):
    rc, out, err = rag.run(["ingest", corpus, "--chunk-tokens", CHUNK_TOKENS])
    check(rc == 0, "ingest of the corpus", describe(rc, out, err))
    names = sorted("small_corpus/" + f for f in os.listdir(corpus) if f.endswith(".md"))

    rc, lst, out, err = rag.json(["list"])
    files = (lst or {}).get("files", [])
    check(rc == 0 and sorted(f["file"] for f in files) == names,
          "list --json names every ingested file", describe(rc, out, err))
    model_file = os.path.basename(rag.model)
    check(lst is not None
          and all(f["chunks"] > 0 and f["tokens"] >= f["chunks"] and f["kv_cached"]
                  and f["kv_cached_chunks"] == f["chunks"] and os.path.isabs(f["path"])
                  and f["title"] for f in files)
          and lst["total_files"] == len(names)
          and lst["total_chunks"] == sum(f["chunks"] for f in files)
          and lst["total_tokens"] == sum(f["tokens"] for f in files)
          and lst["kv_cached_chunks"] == lst["total_chunks"] and lst["kv_bytes"] > 0
          and lst["model"]["file"] == model_file and lst["model_has_kv"] is True
          and [m["file"] for m in lst["kv_models"]] == [model_file],
          "list --json: chunks, tokens, KV cached for every chunk, totals, KV bytes, the model",
          describe(rc, out, err))

    rc, out, err = rag.run(["list"])
    rows = out.splitlines()
    check(rc == 0 and rows[0].split()[:4] == ["file", "chunks", "tokens", "KV"]
          and all(any(l.startswith(n + " ") for l in rows) for n in names)
          and any(l.startswith(f"total: {len(names)} file(s), {lst['total_chunks']} chunk(s)")
                  for l in rows)
          and any(model_file in l for l in rows if l.startswith("KV computed by ingest with:")),
          "list: a row per file, the totals and the model", describe(rc, out, err))

    rc, st, out, err = rag.json(["status"])
    check(rc == 0 and st["files"] == len(names) and st["chunks"] == lst["total_chunks"]
          and st["tokens"] == lst["total_tokens"] and st["kv_entries"] >= st["chunks"]
          and st["kv_bytes"] == lst["kv_bytes"] and st["kv_capacity_bytes"] >= st["kv_bytes"]
          and st["kv_cached_chunks"] == st["chunks"] and st["model_has_kv"] is True
          and st["model"]["file"] == model_file and [t["name"] for t in st["tiers"]] == ["flash"]
          and st["corpus_read_only"] is False and st["kv_read_only"] is False
          and st["chunk_tokens"] == int(CHUNK_TOKENS) and st["system_prompt"] == DEFAULT_SYSTEM
          and st["system_prompt_is_default"] is True and st["schema_version"] == 1,
          "status --json: counts, KV size and capacity, model, tiers, read-only, settings",
          describe(rc, out, err))
    rc, out, err = rag.run(["status"])
    check(rc == 0 and f"chunk tokens:   {CHUNK_TOKENS}" in out and "tiers:          flash" in out
          and f'system prompt:  "{DEFAULT_SYSTEM}" (the default)' in out
          and "the store's model" in out and "read-only:      no" in out and not err,
          "status: the store in lines, nothing on stderr", describe(rc, out, err))
    return lst, st


def test_remove(rag, corpus, before, status_before):
    people = os.path.join(corpus, "people.md")
    rc, _, out, err = rag.json(["ask", QUESTION, "--max-tokens", "4"])
    obj = json.loads(out) if rc == 0 else {}
    check(rc == 0 and "small_corpus/people.md" in [s["file"] for s in obj.get("sources", [])],
          "before remove: ask cites people.md", describe(rc, out, err))

    # One unknown path among known ones: an error, nothing removed.
    rc, out, err = rag.run(["remove", people, os.path.join(corpus, "no-such.md")])
    errors = [l for l in err.splitlines() if l.startswith("rag_assistant: error: ")]
    check(rc == 1 and len(errors) == 1 and "no-such.md" in errors[0]
          and "nothing was removed" in errors[0] and "removed " not in out,
          "remove of an unknown path fails with exit status 1", describe(rc, out, err))
    rc, lst, out, err = rag.json(["list"])
    rc2, st, out2, err2 = rag.json(["status"])
    check(lst == before and st is not None and st["kv_entries"] == status_before["kv_entries"],
          "a failed remove changes neither the files nor the chunk KV", describe(rc, out, err))

    # By path and by the name list shows.
    rc, rem, out, err = rag.json(["remove", people, "small_corpus/meetings.md"])
    removed = sorted(f["file"] for f in (rem or {}).get("removed", []))
    n_chunks = sum(f["chunks"] for f in before["files"]
                   if f["file"] in ("small_corpus/people.md", "small_corpus/meetings.md"))
    check(rc == 0 and removed == ["small_corpus/meetings.md", "small_corpus/people.md"]
          and rem["chunks_removed"] == n_chunks and rem["kv_removed"] == n_chunks
          and rem["files_left"] == before["total_files"] - 2,
          "remove by path and by name: the files, their chunks and their KV",
          describe(rc, out, err))
    rc, lst, out, err = rag.json(["list"])
    left = [f["file"] for f in (lst or {}).get("files", [])]
    check(rc == 0 and "small_corpus/people.md" not in left
          and "small_corpus/meetings.md" not in left and len(left) == before["total_files"] - 2
          and lst["kv_cached_chunks"] == lst["total_chunks"],
          "list no longer shows the removed files", describe(rc, out, err))
    rc, st, out, err = rag.json(["status"])
    check(rc == 0 and st["kv_entries"] == status_before["kv_entries"] - n_chunks,
          "the removed chunks' KV is gone from the chunk KV store", describe(rc, out, err))
    rc, _, out, err = rag.json(["ask", QUESTION, "--max-tokens", "4"])
    obj = json.loads(out) if rc == 0 else {}
    cited = [s["file"] for s in obj.get("sources", [])]
    check(rc == 0 and cited and "small_corpus/people.md" not in cited
          and "small_corpus/meetings.md" not in cited,
          "after remove: ask no longer cites the removed files", describe(rc, out, err))


def test_system_prompt(rag):
    custom = "Answer from the documents in one sentence."
    rc, st0, out, err = rag.json(["status"])
    rc, ing, out, err = rag.json(["ingest", "--system", custom])
    check(rc == 0 and ing["kv_computed"] == st0["chunks"] and ing["kv_removed"] == st0["chunks"]
          and ing["files_unchanged"] == st0["files"] and "system prompt changed" in err,
          "ingest --system (no paths): every chunk's KV computed again, the old KV removed",
          describe(rc, out, err))
    rc, st, out, err = rag.json(["status"])
    check(rc == 0 and st["system_prompt"] == custom and st["system_prompt_is_default"] is False
          and st["kv_entries"] == st0["kv_entries"] and st["kv_cached_chunks"] == st["chunks"],
          "the system prompt is recorded in the store", describe(rc, out, err))
    rc, obj, out, err = rag.json(["ask", QUESTION, "--max-tokens", "4"])
    check(rc == 0 and obj["cache_hits"] > 0 and obj["cache_misses"] == 0
          and not warnings(err, "system prompt"),
          "ask uses the store's system prompt: every chunk a hit", describe(rc, out, err))
    rc, obj, out, err = rag.json(["ask", QUESTION, "--max-tokens", "4", "--system", "Be terse."])
    check(rc == 0 and obj["cache_hits"] == 0 and obj["cache_misses"] > 0 and obj["answer"]
          and len(warnings(err, "another system prompt")) == 1
          and "ingest --system 'Be terse.'" in err,
          "ask --system other than the store's: answered, every chunk a miss, one warning",
          describe(rc, out, err))
    rc, out, err = rag.run(["ingest", "--system", ""])
    check(rc == 2, "--system with an empty text is a usage error", describe(rc, out, err))
    rc, out, err = rag.run(["list", "--system", "x"])
    check(rc == 2, "--system is not for list", describe(rc, out, err))


def test_other_model(rag, other_model):
    if not os.path.exists(other_model):
        check(False, "the second model is present",
              f"{other_model} is missing; run scripts/setup.sh model")
        return
    mine = os.path.basename(rag.model)
    theirs = os.path.basename(other_model)
    rc, obj, out, err = rag.json(["ask", QUESTION, "--max-tokens", "2"], model=other_model)
    w = warnings(err, f"the store's KV was computed with {mine}; {theirs} will recompute every "
                      "chunk (slow)")
    check(rc == 0 and obj["answer"] and obj["cache_hits"] == 0 and len(w) == 1
          and f"--model {other_model} ingest" in w[0],
          "ask with another model: one warning naming both models and the ingest to run, "
          "then the answer", describe(rc, out, err))
    # The ask stored the KV it computed for the chunks it read, no more.
    rc, lst, out, err = rag.json(["list"], model=other_model)
    check(rc == 0 and lst["model_has_kv"] is False
          and lst["kv_cached_chunks"] <= len(obj["sources"]) < lst["total_chunks"]
          and len(warnings(err, "will recompute every chunk")) == 1,
          "list with another model: only the asked chunks cached for it, and the warning",
          describe(rc, out, err))
    rc, out, err = rag.run(["status"], model=other_model)
    check(rc == 0 and "not the store's model" in out
          and len(warnings(err, "will recompute every chunk")) == 1,
          "status with another model says so", describe(rc, out, err))
    rc, ing, out, err = rag.json(["ingest"], model=other_model)
    check(rc == 0 and ing["kv_computed"] == lst["total_chunks"] - lst["kv_cached_chunks"],
          "ingest with another model precomputes every chunk for it", describe(rc, out, err))
    rc, lst, out, err = rag.json(["list"], model=other_model)
    check(rc == 0 and lst["model_has_kv"] is True
          and lst["kv_cached_chunks"] == lst["total_chunks"]
          and [m["file"] for m in lst["kv_models"]] == [theirs, mine] and not err,
          "both models are recorded, the newest first", describe(rc, out, err))
    rc, out, err = rag.run(["ask", QUESTION, "--max-tokens", "2"])
    check(rc == 0 and not warnings(err, "recompute"),
          "the first model is still the store's: no warning", describe(rc, out, err))
    test_store_model(rag, other_model)


def test_store_model(rag, last_model):
    """Without --model (and $CB_MODEL), the model of the store's last ingest."""
    rc, st, out, err = rag.json(["status"], model="")
    check(rc == 0 and st["model_path"] == last_model and st["model_has_kv"] is True and not err,
          "no --model: the model of the store's last ingest", describe(rc, out, err))
    # Through a link that then goes away: the default model's rule applies.
    link = os.path.join(os.path.dirname(rag.store), "gone.gguf")
    os.symlink(rag.model, link)
    rc, ing, out, err = rag.json(["ingest"], model=link)
    check(rc == 0 and ing["kv_computed"] == 0, "ingest through a link to a model with KV",
          describe(rc, out, err))
    rc, st, out, err = rag.json(["status"], model="")
    check(rc == 0 and st["model_path"] == link, "the store's model is the link now",
          describe(rc, out, err))
    os.remove(link)
    rc, st, out, err = rag.json(["status"], model="")
    default_missing = rc == 1 and "no model" in err and link in err
    default_used = (rc == 0 and st["model_path"] != link
                    and len(warnings(err, "will recompute every chunk")) == 1)
    check(default_missing or default_used,
          "the store's model gone: the default model (or an error naming both)",
          describe(rc, out, err))
    rc, out, err = rag.run(["ingest"])
    check(rc == 0, "ingest with the test's model again", describe(rc, out, err))


def test_usage(rag):
    for args, what in ((["list", "extra"], "list takes no arguments"),
                       (["remove"], "remove needs a PATH"),
                       (["status", "--top-k", "2"], "ask's options are not for status")):
        rc, out, err = rag.run(args)
        check(rc == 2 and "rag_assistant: error: " in err, what, describe(rc, out, err))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--other-model", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="rag_manage_")
    try:
        rag = Rag(os.path.abspath(a.bin), os.path.abspath(a.model), os.path.join(tmp, "store"))
        test_version(rag)
        lst, st = test_list_and_status(rag, os.path.abspath(a.corpus))
        test_remove(rag, os.path.abspath(a.corpus), lst, st)
        test_system_prompt(rag)
        test_other_model(rag, os.path.abspath(a.other_model))
        test_usage(rag)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
