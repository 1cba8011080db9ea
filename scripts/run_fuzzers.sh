#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time from seeds in the real
# formats: GGUF files cut from the model's header bytes, text for the
# tokenizer, chunk-KV values for the codecs, edits that damage a chunk store,
# documents of every kind the RAG assistant reads (the repository's own
# Markdown, HTML, reStructuredText, gzip), and questions for its retrieval.
# Usage: run_fuzzers.sh BUILD_DIR SECONDS
set -euo pipefail
BUILD=${1:?build dir}
SECONDS_EACH=${2:-30}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${CB_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
WORK="$BUILD/fuzz-work"
TARGETS="gguf tokenizer kv_codec chunk_store documents retrieval"
for target in $TARGETS; do mkdir -p "$WORK/$target-corpus"; done

# The first 64 KiB of the model hold the header and much of the metadata.
head -c 65536 "$MODEL" > "$WORK/gguf-corpus/model-head.gguf"
head -c 1024 "$MODEL" > "$WORK/gguf-corpus/model-1k.gguf"
printf 'Hello, World! 123 4567 don'"'"'t  \t\n\n<|im_start|>user\nCaf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80' > "$WORK/tokenizer-corpus/seed.txt"

# fuzz_kv_codec: codec, tokens, heads, head size, damage position (2 bytes)
# and byte, bytes cut, then f32 values; fuzz_chunk_store: edit records (a
# kind byte: SQL edit, raw index byte or blob damage, then its operands);
# fuzz_documents: a byte naming the file (its index in the target's list;
# 0x80 for a 64-byte limit), a byte for the chunk size, then the file;
# fuzz_retrieval: a byte of options, then the question.
python3 - "$WORK" "$ROOT" <<'PY'
import gzip, pathlib, struct, sys
work, root = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
values = struct.pack("<8f", 0.5, -1.25, 3.0, 0.0, -0.001, 65504.0, 1e-7, -7.5)
for codec in range(3):
    (work / "kv_codec-corpus" / f"seed-{codec}").write_bytes(
        bytes([codec, 39, 2, 7, 9, 0, 0x40, 3]) + values)
store = work / "chunk_store-corpus"
# segments.offset of row 0 set to 64; entries.n_tokens of row 1 plus 1; a byte
# of the index's header; a blob cut to 100 bytes; segments.layer of row 4 set
# to -1 then a row of entries deleted; and eight edits in one input (the
# longest seed sets how long the fuzzer's first inputs may be).
for name, edits in {"offset": [0, 1, 17, 0, 0, 6], "tokens": [1, 2, 8, 1, 1],
                    "header": [2, 0, 0, 47, 63], "cut": [3, 1, 1, 0, 100],
                    "layer": [0, 1, 16, 4, 0, 2, 0, 0, 0, 0],
                    "eight": [0, 1, 16, 0, 0, 1, 0, 1, 16, 1, 0, 2, 1, 2, 12, 2, 3,
                              2, 0, 16, 40, 7, 3, 0, 0, 0, 200, 1, 1, 7, 2, 5,
                              0, 0, 15, 5, 3, 2, 1, 0, 40, 0, 9, 0, 0]}.items():
    (store / name).write_bytes(bytes(edits))
docs = work / "documents-corpus"
md = (root / "README.md").read_bytes()[:6000]
html = (b"<html><head><title>T &amp; t</title><style>p{}</style></head><body>"
        b"<h1>One</h1><p>A&nbsp;b &#233; &#x1F600;<br>c</p><script>x<y</script>"
        b"<!-- c --><ul><li>item</li></ul><h2>Two</h2><pre>code</pre></body></html>")
rst = b"Title\n=====\n\nText *here*.\n\nSection\n-------\n\n.. note:: a note\n\n::\n\n  code\n"
seeds = {"md": (0, md), "html": (3, html), "rst": (2, rst), "html-gz": (4, gzip.compress(html)),
         "md-gz": (5, gzip.compress(md)), "readme": (6, b"Plain text\n\n# Heading\nmore"),
         "md-small": (0x80, md[:200])}
for name, (kind, data) in seeds.items():
    (docs / name).write_bytes(bytes([kind, 24]) + data)
questions = [b"How much is the meal allowance in Poland?", b"What is the cat NAMED?",
             b'cat" OR NEAR(( AND * ^ name:Mochi', "Caf\u00e9 \u6771\u4eac \u2013 why?".encode()]
for i, q in enumerate(questions):
    (work / "retrieval-corpus" / f"seed-{i}").write_bytes(bytes([i * 0x41]) + q)
PY

status=0
for target in $TARGETS; do
  echo "fuzz_$target: running for ${SECONDS_EACH}s"
  if ! "$BUILD/bin/fuzz_$target" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$WORK/crash-$target-" "$WORK/$target-corpus" \
       > "$WORK/$target.log" 2>&1; then
    echo "fuzz_$target FAILED; log tail:"; tail -n 40 "$WORK/$target.log"; status=1
  else
    grep -E "stat::number_of_executed_units|DONE" "$WORK/$target.log" | tail -n 2
  fi
done
if [ $status -eq 0 ]; then echo "fuzzers: every target ran clean"; else echo "fuzzers: a target failed"; fi
exit $status
