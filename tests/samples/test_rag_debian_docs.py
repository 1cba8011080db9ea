#!/usr/bin/env python3
"""rag_assistant end to end over documents the project did not write: README
files that Debian packages install (docs/bench/assistant_eval_debian.json
lists them and questions answered in them), read as they are (Markdown,
gzip, extensionless) and, converted at test time, as HTML and
reStructuredText.  With a real instruct model: ingest (lazy KV), questions
with known answers in blend and full mode, a question the documents do not
answer (the relevance floor: exit 3), and a chat follow-up that needs the
previous turn.

  test_rag_debian_docs.py --bin build/bin/rag_assistant --questions docs/bench/assistant_eval_debian.json
                          --model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""
import argparse
import gzip
import html
import json
import os
import re
import sys
import tempfile

from rag_harness import Rag, check, describe, finish

# Answered right by the test model in both modes on this corpus (the
# others of the question file are left to scripts/eval_assistant.py).
ASKED = ("Which library is libsodium a fork of?",
         "Which C standard does the man-db source code require from the compiler?",
         "Which types of HTTP authentication does httplib2 support?")
NO_ANSWER = "What is the boiling point of liquid nitrogen in kelvin?"
# The follow-up names neither httplib2 nor its README.
FIRST = "Which types of HTTP authentication does httplib2 support?"
FOLLOW_UP = "And which compression types does it handle?"
FOLLOW_UP_EXPECT = ("deflate", "gzip")


def read_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()


def as_html(markdown):
    """A page as a browser would get it: headings, paragraphs, a script."""
    out = ["<!DOCTYPE html><html><head><title>Notes</title>",
           "<script>var tracking = 'not documentation';</script></head><body>"]
    for block in re.split(r"\n\s*\n", markdown):
        m = re.match(r"(#+)\s+(.*)", block.strip())
        if m:
            level = min(len(m.group(1)), 6)
            out.append(f"<h{level}>{html.escape(m.group(2))}</h{level}>")
        elif block.strip():
            out.append(f"<p>{html.escape(block.strip())}</p>")
    out.append("</body></html>")
    return "\n".join(out)


def as_rst(markdown):
    lines = []
    for line in markdown.splitlines():
        m = re.match(r"(#+)\s+(.*)", line)
        if m:
            title = m.group(2).strip()
            lines += [title, ("=" if len(m.group(1)) == 1 else "-") * max(len(title), 3)]
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def build_corpus(files, folder):
    """Copies the files that exist; the libsodium README becomes HTML and the
    Node.js security policy reStructuredText.  Returns what was written."""
    os.makedirs(folder)
    written = []
    for path in files:
        if not os.path.exists(path):
            continue
        name = path.strip("/").split("/")[3] + "-" + os.path.basename(path)  # package-file
        if "libsodium" in path:
            name, data = name.rsplit(".", 1)[0] + ".html", as_html(read_text(path)).encode()
        elif "nodejs" in path:
            name, data = name.rsplit(".", 1)[0] + ".rst", as_rst(read_text(path)).encode()
        else:
            with open(path, "rb") as f:
                data = f.read()  # .gz and extensionless files as installed
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        written.append(name)
    return written


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    with open(a.questions) as f:
        spec = json.load(f)
    expect = {q["question"]: q for q in spec["questions"]}
    rag = Rag(a.bin, a.model)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "docs")
        written = build_corpus(spec["files"], corpus)
        needed = ("zstd", "libsodium", "redis-server", "nodejs")
        if not all(any(n in w for w in written) for n in needed):
            print(f"SKIP: the Debian documents this test reads are not installed ({written})")
            return 0
        types = {os.path.splitext(w)[1] or "(none)" for w in written}
        store = os.path.join(tmp, "store")
        rc, obj, out, err = rag.json(["--store", store, "ingest", corpus, "--kv", "lazy"])
        check(rc == 0 and obj and obj["files_new"] == len(written) and obj["files_skipped"] == 0,
              f"ingest of {len(written)} installed documents ({', '.join(sorted(types))})",
              describe(rc, out, err))

        def right(question, answer):
            q = expect[question]
            hits = [e.lower() in answer.lower() for e in q["expect"]]
            return all(hits) if q.get("all") else any(hits)

        for q in ASKED:
            for mode in ("blend", "full"):
                rc, o, out, err = rag.json(["--store", store, "ask", q, "--mode", mode,
                                            "--max-tokens", "48"])
                check(rc == 0 and o and right(q, o["answer"]), f"{mode}: {q}",
                      describe(rc, out, err))
        rc, out, err = rag.run(["--store", store, "ask", NO_ANSWER])
        check(rc == 3 and "could not find" in out and "TTFT" not in out,
              "a question the documents do not answer: not found, exit 3", describe(rc, out, err))

        rc, out, err = rag.run(["--store", store, "chat", "--max-tokens", "48"],
                               stdin=f"{FIRST}\n{FOLLOW_UP}\n".encode())
        # answer 1, ---, report 1 and answer 2, ---, report 2
        parts = out.split("\n---\n")
        ok = (rc == 0 and len(parts) == 3 and parts[2].startswith("TTFT")
              and "follow-up:" in parts[2]
              and all(e in parts[1].split("\n", 2)[-1].lower() for e in FOLLOW_UP_EXPECT))
        check(ok, "chat: a follow-up that needs the previous turn is answered from it",
              describe(rc, out, err))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
