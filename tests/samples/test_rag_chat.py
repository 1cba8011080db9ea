#!/usr/bin/env python3
"""rag_assistant chat as a conversation: a follow-up that needs the previous
turn is answered from the same session (the earlier turns' KV reused), the
retrieval for a follow-up uses the previous question too, /sources and
/reset, and a conversation that no longer fits goes on from its last
exchange.

  test_rag_chat.py --bin build/bin/rag_assistant --corpus tests/samples/fixtures/small_corpus
                   --model models/X.gguf
"""
import argparse
import os
import re
import sys
import tempfile

from rag_harness import Rag, check, describe, finish

# people.md says where Zofia Brandvold works; offices.md which office has a
# cat.  The follow-up names neither Zofia nor her office.
FIRST = "Which office does Zofia Brandvold work in?"
FOLLOW_UP = "What is the name of the office cat there?"
ANSWER = "Mochi"


def reports(out):
    return [l for l in out.splitlines() if l.startswith("TTFT ")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model")
    a = ap.parse_args()
    rag = Rag(a.bin, a.model)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        rc, out, err = rag.run(["--store", store, "ingest", a.corpus, "--chunk-tokens", "48"])
        check(rc == 0, "ingest", describe(rc, out, err))

        lines = (f"{FIRST}\n{FOLLOW_UP}\n/sources\nAnd its xylophone budget?\nWhy?\n/reset\n"
                 f"{FOLLOW_UP}\n")
        rc, out, err = rag.run(["--store", store, "chat", "--max-tokens", "24"],
                               stdin=lines.encode())
        r = reports(out)
        check(rc == 0 and len(r) == 4, "four answers, four reports", describe(rc, out, err))
        if len(r) == 4:
            m = re.search(r"follow-up: (\d+) earlier token\(s\) reused, (\d+) computed", r[1])
            check("mode blend" in r[0] and m and int(m.group(1)) > int(m.group(2)) > 0,
                  "the follow-up reuses the conversation's KV and computes only its own turn",
                  r[1])
            check("follow-up:" in r[2],
                  "a follow-up of stopwords only goes on from the conversation", r[2])
            check("mode blend" in r[3], "after /reset the question is a new RAG request", r[3])
        check(out.count("I could not find this in your documents.") == 1,
              "a follow-up about words the documents lack is not found", out[-1500:])
        answers = out.split("\n---\n")
        check(len(answers) >= 2 and ANSWER in answers[1],
              "the follow-up is answered from the previous turn's context", out[-1500:])
        src = [l for l in out.splitlines() if l.startswith("sources:")]
        check(len(src) >= 3 and src[2] == src[1] and "offices.md" in src[1],
              "/sources lists the last answer's sources; the follow-up retrieved the cat's office",
              "\n".join(src))
        check("(a new conversation)" in out, "/reset says so", out[-800:])

        # A session sized for the first request and a long answer (the
        # first one is short), then a long follow-up: it does not fit, and
        # the conversation starts again from the last exchange.
        long_follow_up = " ".join([FOLLOW_UP] * 15)
        # (--stop ends each answer at its first line.)
        rc, out, err = rag.run(["--store", store, "chat", "--max-tokens", "4000", "--stop", "\n"],
                               stdin=f"{FIRST}\n{long_follow_up}\n".encode(), timeout=600)
        r = reports(out)
        check(rc == 0 and len(r) == 2 and "no longer fits" in err and "mode blend" in r[1],
              "a conversation that no longer fits goes on as a new request",
              describe(rc, out, err))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
