#!/usr/bin/env python3
"""Measures rag_assistant's retrieval on labelled questions.

  eval_retrieval.py --bin build/bin/rag_assistant --model models/SmolLM2-135M-Instruct.Q4_1.gguf
                    --set docs/bench/retrieval/demo_corpus.jsonl
                    --corpus samples/rag_assistant/demo_corpus
  eval_retrieval.py ... --set docs/bench/retrieval/debian_docs.jsonl --corpus debian-docs

A set is JSON lines: {"question", "file", "phrase"} for a question that the
file answers (the phrase is in the chunk that answers it), or {"question",
"none": true} for one whose answer is in no file.  --corpus debian-docs
builds a corpus at run time from the Debian documentation installed with
the project's packages (build_debian_corpus below).

The corpus is ingested into a temporary store with --kv lazy (no KV: only
retrieval is measured; the model only counts tokens for the chunker), then
each question goes through `ask --retrieve-only --json --min-relevance 0`:
plain BM25 (--no-diversity) and with the per-file cap, at --top-k 1, 3 and 5.
With --dense MODEL, also dense retrieval (cosine of the runtime's pooled
hidden states, Session.embed) and a hybrid of it with BM25 (reciprocal-rank
fusion), scored the same way.
Reported: recall@1/@3/@5 (the answer file among the first k sources),
phrase@5 (a source's text holds the phrase), MRR (over 5), and for the
relevance floor at each threshold X: answerable questions kept (relevance
>= X) and no-answer questions refused (relevance < X), with precision and
recall of the refusals.  The default floor is also checked end to end: each
question's exit status under rag_assistant's default --min-relevance must
be 3 exactly when the computed decision refuses it.
"""
import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

THRESHOLDS = [0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7]
# Bounds one file's share of the corpus (long changelogs) and its ingest time.
MAX_FILE_BYTES = 32 * 1024


def read_set(path):
    items = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            o = json.loads(line)
            if "question" not in o or not (o.get("none") or ("file" in o and "phrase" in o)):
                sys.exit(f"{path}:{n}: needs question and file and phrase, or none: true")
            items.append(o)
    return items


def setup_packages(root):
    """The Debian packages scripts/setup.sh installs."""
    with open(os.path.join(root, "scripts", "setup.sh"), encoding="utf-8") as f:
        m = re.search(r"^PACKAGES=\((.*?)\)", f.read(), re.S | re.M)
    return m.group(1).split()


def installed_packages():
    """Installed package: (essential or required, its dependencies)."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Status}\t${Essential}\t"
                          "${Priority}\t${Pre-Depends},${Depends}\n"],
                         capture_output=True, text=True, check=True).stdout
    pkgs = {}
    for line in out.splitlines():
        name, status, essential, priority, deps = line.split("\t")
        if "install ok installed" in status:
            pkgs[name.split(":")[0]] = (essential == "yes" or priority == "required", deps)
    return pkgs


def build_debian_corpus(root, dest):
    """Debian's documentation of the project's packages, their dependencies
    and the essential ones, as they are on any Debian bookworm where
    scripts/setup.sh ran: every README* and *.md of those packages, plus the
    changelog.Debian and copyright of the packages setup.sh names, each file
    decompressed (gzip) and cut to MAX_FILE_BYTES at a line end.  Written as
    PACKAGE__NAME.md or .txt, in sorted order.  Returns the file count."""
    wanted = setup_packages(root)
    pkgs = installed_packages()
    missing = [p for p in wanted if p not in pkgs]
    if missing:
        sys.exit("eval_retrieval: packages of scripts/setup.sh are not installed: "
                 + " ".join(missing) + " (run scripts/setup.sh)")
    closure, stack = set(), sorted(set(wanted) | {p for p, (base, _) in pkgs.items() if base})
    while stack:
        p = stack.pop()
        if p in closure or p not in pkgs:
            continue
        closure.add(p)
        for dep in pkgs[p][1].split(","):
            for alt in dep.split("|"):  # the first alternative installed
                name = alt.strip().split(" ")[0].split(":")[0]
                if name in pkgs:
                    stack.append(name)
                    break
    os.makedirs(dest, exist_ok=True)
    seen_dirs, n = set(), 0
    for p in sorted(closure):
        d = os.path.join("/usr/share/doc", p)
        if not os.path.isdir(d) or os.path.realpath(d) in seen_dirs:
            continue
        seen_dirs.add(os.path.realpath(d))
        for name in sorted(os.listdir(d)):
            base = name[:-3] if name.endswith(".gz") else name
            readme = base.startswith("README") or base.endswith(".md")
            # Architecture-specific notes differ between machines.
            if re.search(r"\.(amd64|arm64|i386|armhf)$", base):
                continue
            own = p in wanted and base in ("changelog.Debian", "copyright")
            src = os.path.join(d, name)
            if not (readme or own) or not os.path.isfile(src):
                continue
            opener = gzip.open if name.endswith(".gz") else open
            with opener(src, "rb") as f:
                data = f.read(4 * MAX_FILE_BYTES)
            if len(data) > MAX_FILE_BYTES:
                data = data[:MAX_FILE_BYTES]
                data = data[:data.rfind(b"\n") + 1] or data
            if b"\0" in data or not data.strip():
                continue
            out = f"{p}__{base}" + ("" if base.endswith(".md") else ".txt")
            with open(os.path.join(dest, out), "wb") as f:
                f.write(data)
            n += 1
    return n


def norm(s):
    return " ".join(s.split()).lower()


class Rag:
    def __init__(self, binary, model, store, threads):
        self.base = [binary, "--store", store, "--threads", str(threads)]
        self.model = ["--model", model]

    def ingest(self, corpus, chunk_tokens):
        p = subprocess.run(self.base + self.model + ["ingest", corpus, "--kv", "lazy",
                                                     "--chunk-tokens", str(chunk_tokens), "--json"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("eval_retrieval: ingest failed:\n" + p.stderr)
        return json.loads(p.stdout)

    def retrieve(self, question, top_k, diversity, floor=None):
        args = ["ask", question, "--retrieve-only", "--json", "--top-k", str(top_k)]
        args += ["--min-relevance", str(floor)] if floor is not None else []
        args += [] if diversity else ["--no-diversity"]
        p = subprocess.run(self.base + args, capture_output=True, text=True)
        if p.returncode not in (0, 3):
            sys.exit(f"eval_retrieval: ask failed ({p.returncode}) for {question!r}:\n{p.stderr}")
        return p.returncode, json.loads(p.stdout)


def rank_of(item, sources):
    """1-based rank of the first source from the answer file, else None."""
    for i, s in enumerate(sources, 1):
        if os.path.basename(s["file"]) == item["file"]:
            return i
    return None


def evaluate(rag, items, store_info):
    answerable = [q for q in items if not q.get("none")]
    unanswerable = [q for q in items if q.get("none")]
    result = {"questions": len(answerable), "no_answer_questions": len(unanswerable),
              "chunks": store_info.get("chunks"), "methods": {}, "floor": [], "misses": {}}
    relevance = {}
    for name, diversity in (("bm25", False), ("bm25+diversity", True)):
        hits = {1: 0, 3: 0, 5: 0}
        phrase5, rr, misses, one_file3 = 0, 0.0, [], 0
        for q in answerable:
            ranks = {}
            for k in (1, 3, 5):
                _, o = rag.retrieve(q["question"], k, diversity, floor=0)
                if diversity and k == 3:  # the floor is measured as ask runs it by default
                    relevance[q["question"]] = o["relevance"]
                ranks[k] = rank_of(q, o["sources"])
                if k == 3:
                    files3 = {s["file"] for s in o["sources"]}
                    one_file3 += len(o["sources"]) == 3 and len(files3) == 1
                hits[k] += ranks[k] is not None
            rr += 1.0 / ranks[5] if ranks[5] else 0.0
            phrase5 += any(norm(q["phrase"]) in norm(s["text"]) for s in o["sources"])
            if ranks[3] is None:
                misses.append({"question": q["question"], "file": q["file"],
                               "got": [os.path.basename(s["file"]) for s in o["sources"][:3]]})
        n = max(len(answerable), 1)
        result["methods"][name] = {"recall@1": hits[1] / n, "recall@3": hits[3] / n,
                                   "recall@5": hits[5] / n, "phrase@5": phrase5 / n,
                                   "mrr": rr / n, "one_file_top3": one_file3 / n}
        result["misses"][name] = misses
    for q in unanswerable:
        _, o = rag.retrieve(q["question"], 3, True, floor=0)
        relevance[q["question"]] = o["relevance"]
    for x in THRESHOLDS:
        kept = sum(relevance[q["question"]] >= x for q in answerable)
        refused = sum(relevance[q["question"]] < x for q in unanswerable)
        wrongly_refused = len(answerable) - kept
        result["floor"].append({
            "min_relevance": x, "answerable_kept": kept / max(len(answerable), 1),
            "refusal_recall": refused / max(len(unanswerable), 1),
            "refusal_precision": (refused / (refused + wrongly_refused)
                                  if refused + wrongly_refused else 1.0)})
    # The default floor, end to end: exit status 3 exactly when refused.
    mismatches = []
    default = None
    for q in items:
        rc, o = rag.retrieve(q["question"], 3, True)
        default = o["min_relevance"]
        if (rc == 3) != (relevance[q["question"]] < default):
            mismatches.append(q["question"])
    result["default_min_relevance"] = default
    result["default_floor_mismatches"] = mismatches
    result["relevance"] = relevance
    return result


def load_bindings(root):
    """The Python bindings of this tree, on the library of its build."""
    sys.path.insert(0, os.path.join(root, "bindings", "python"))
    lib = os.path.join(root, "build", "lib", "libcacheblend.so")
    if "CACHEBLEND_LIBRARY" not in os.environ and os.path.exists(lib):
        os.environ["CACHEBLEND_LIBRARY"] = lib
    import cacheblend
    return cacheblend


def dense_methods(rag, items, store, model_path, threads, root, depth=20):
    """Dense retrieval (the cosine of pooled last hidden states,
    Session.embed, of each chunk's text and the question) and a hybrid:
    reciprocal-rank fusion (k = 60) of BM25's first `depth` chunks and the
    dense order.  Scored as evaluate() scores BM25: the first k chunks."""
    import sqlite3
    cb = load_bindings(root)
    con = sqlite3.connect(os.path.join(store, "corpus.sqlite"))
    chunks = con.execute("SELECT chunks.id, files.path, chunks.text FROM chunks "
                         "JOIN files ON files.id = chunks.file_id ORDER BY chunks.id").fetchall()
    con.close()
    model = cb.Model(model_path, n_threads=threads)
    session = cb.Session(model, n_ctx=2048)
    t0 = time.time()
    vecs = {}
    for cid, path, text in chunks:
        ids = model.tokenize(text, add_special=False)[:2048]
        vecs[cid] = session.embed(ids)
    embed_s = time.time() - t0
    info = {cid: (os.path.basename(path), text) for cid, path, text in chunks}

    def dot(a, b):
        return sum(x * y for x, y in zip(a, b))

    orders = {"dense": [], "hybrid": []}
    answerable = [q for q in items if not q.get("none")]
    for q in answerable:
        e = session.embed(q["question"])
        dense = sorted(vecs, key=lambda c: -dot(e, vecs[c]))
        _, o = rag.retrieve(q["question"], depth, False, floor=0)
        bm25 = [src["id"] for src in o["sources"]]
        score = {}
        for r, c in enumerate(bm25, 1):
            score[c] = score.get(c, 0.0) + 1.0 / (60 + r)
        for r, c in enumerate(dense, 1):
            score[c] = score.get(c, 0.0) + 1.0 / (60 + r)
        orders["dense"].append(dense)
        orders["hybrid"].append(sorted(score, key=lambda c: -score[c]))
    out = {}
    n = max(len(answerable), 1)
    for name, per_q in orders.items():
        hits = {1: 0, 3: 0, 5: 0}
        rr, phrase5, one_file3 = 0.0, 0, 0
        for q, order in zip(answerable, per_q):
            files = [info[c][0] for c in order[:5]]
            rank = next((i for i, f in enumerate(files, 1) if f == q["file"]), None)
            for k in hits:
                hits[k] += rank is not None and rank <= k
            rr += 1.0 / rank if rank else 0.0
            phrase5 += any(norm(q["phrase"]) in norm(info[c][1]) for c in order[:5])
            one_file3 += len(set(files[:3])) == 1
        out[name] = {"recall@1": hits[1] / n, "recall@3": hits[3] / n, "recall@5": hits[5] / n,
                     "phrase@5": phrase5 / n, "mrr": rr / n, "one_file_top3": one_file3 / n}
    out["dense"]["embed_s"] = embed_s
    out["dense"]["model"] = os.path.basename(model_path)
    session.close()
    model.close()
    return out


def markdown(name, r):
    lines = [f"{name}: {r['questions']} answerable and {r['no_answer_questions']} no-answer "
             f"questions, {r['chunks']} chunks", "",
             "| retrieval | recall@1 | recall@3 | recall@5 | phrase@5 | MRR | top 3 from one file |",
             "|---|---|---|---|---|---|---|"]
    for m, v in r["methods"].items():
        lines.append(f"| {m} | {v['recall@1']:.2f} | {v['recall@3']:.2f} | {v['recall@5']:.2f} "
                     f"| {v['phrase@5']:.2f} | {v['mrr']:.2f} | {v['one_file_top3']:.2f} |")
    lines += ["", "| --min-relevance | answerable kept | no-answer refused (recall) "
              "| refusal precision |", "|---|---|---|---|"]
    for f in r["floor"]:
        mark = " (default)" if abs(f["min_relevance"] - r["default_min_relevance"]) < 1e-9 else ""
        lines.append(f"| {f['min_relevance']:.2f}{mark} | {f['answerable_kept']:.2f} "
                     f"| {f['refusal_recall']:.2f} | {f['refusal_precision']:.2f} |")
    return "\n".join(lines)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(root, "build", "bin", "rag_assistant"))
    ap.add_argument("--model", default=os.path.join(root, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--set", required=True, help="labelled questions (JSON lines)")
    ap.add_argument("--corpus", required=True,
                    help="a folder to ingest, or debian-docs (built from /usr/share/doc)")
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the full results (per-question relevance) here")
    ap.add_argument("--keep", help="build the corpus and store under this folder and keep them")
    ap.add_argument("--dense", metavar="MODEL",
                    help="also score dense and hybrid retrieval, embedding with this GGUF "
                         "(needs the Python bindings and build/lib)")
    args = ap.parse_args()

    items = read_set(args.set)
    work = args.keep or tempfile.mkdtemp(prefix="eval_retrieval_")
    try:
        corpus = args.corpus
        if corpus == "debian-docs":
            corpus = os.path.join(work, "debian_docs")
            shutil.rmtree(corpus, ignore_errors=True)
            n = build_debian_corpus(root, corpus)
            print(f"debian-docs: {n} files", file=sys.stderr)
        files = set(os.listdir(corpus))
        absent = sorted({q["file"] for q in items if not q.get("none")} - files)
        if absent:
            sys.exit("eval_retrieval: labelled files not in the corpus: " + ", ".join(absent))
        store = os.path.join(work, "store")
        shutil.rmtree(store, ignore_errors=True)
        rag = Rag(args.bin, args.model, store, args.threads)
        info = rag.ingest(corpus, args.chunk_tokens)
        r = evaluate(rag, items, info)
        if args.dense:
            r["methods"].update(dense_methods(rag, items, store, args.dense, args.threads, root))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(markdown(os.path.basename(args.set), r))
    for m, misses in r["misses"].items():
        for x in misses:
            print(f"miss@3 {m}: {x['question']!r} wants {x['file']}, got {x['got']}",
                  file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    if r["default_floor_mismatches"]:
        print("eval_retrieval: the default floor's exit status disagrees with its relevance for: "
              + "; ".join(r["default_floor_mismatches"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
