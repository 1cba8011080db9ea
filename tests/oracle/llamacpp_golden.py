#!/usr/bin/env python3
"""Writes the llama.cpp golden files the C++ runtime is tested against.

Run through scripts/regen_goldens.sh (it builds the venv with the pinned
llama-cpp-python and points it at the peer's libllama).  Needs llama_cpp.

    llamacpp_golden.py --model M.gguf --golden tests/golden/llamacpp.json
                       --prompts tests/golden/reference_prompts.json [--dump-logits DIR]
                       [--chat chatml|gemma] [--n-batch N]

llamacpp.json:
  "tokenize": [{"text", "add_special", "parse_special", "ids"}]   llama_tokenize()
  "greedy":   [{"name", "text", "prompt_ids", "ids", "stop", "top2"}]
              ids: up to N_GEN argmax tokens (no sampler, no penalties); generation
              stops after an end-of-generation token (it is included, stop="eog"),
              else stop="length".  top2[i] = {"ids": [a, b], "logits": [la, lb]} of
              the logits that produced ids[i], so a divergence can be shown to be a
              near-tie.
  "meta":     versions, model sha256, date, context settings.
reference_prompts.json: the greedy prompts' ids, the input of reference_forward.py.
--dump-logits DIR: llama.cpp's last-prompt-position logits per prompt as
<name>.logits.f32 (for tests/oracle/compare_reference.py; not committed).

Chat prompts are built here as text in the model family's format (--chat): plain ChatML,
"<|im_start|>role\\ncontent<|im_end|>\\n" per turn, then "<|im_start|>assistant\\n"; or
Gemma's, "<start_of_turn>user\\ncontent<end_of_turn>\\n" per turn (a system turn joins
the first user turn, as Gemma's template does), then "<start_of_turn>model\\n".  The
model file's own Jinja template is not used (SmolLM2's injects a default system turn).
--n-batch 1 evaluates prompts one token at a time (a peer built for a CPU whose batched
path fails on some architectures still gives the same logits to its precision).
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_json import dump  # noqa: E402

N_GEN = 32
N_CTX = 512
N_THREADS = 2


def chatml(turns: list[tuple[str, str]]) -> str:
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in turns) + "<|im_start|>assistant\n"


def gemma(turns: list[tuple[str, str]]) -> str:
    system = "".join(c + "\n\n" for r, c in turns if r == "system")
    out = []
    for r, c in (t for t in turns if t[0] != "system"):
        role = "model" if r == "assistant" else "user"
        if role == "user" and system:
            c, system = system + c, ""
        out.append(f"<start_of_turn>{role}\n{c}<end_of_turn>\n")
    return "".join(out) + "<start_of_turn>model\n"


CHAT = {"chatml": chatml, "gemma": gemma}
chat = chatml

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def prompts() -> list[tuple[str, str]]:
  """(name, text): all tokenized with parse_special=True, add_special=True."""
  return [
    ("plain_france", "The capital of France is"),
    ("plain_days", "Monday, Tuesday, Wednesday,"),
    ("plain_story", "Once upon a time, in a small village at the edge of the forest,"),
    ("code_fib", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("chat_france", chat([("user", "What is the capital of France?")])),
    ("chat_system_math", chat([("system", SYSTEM), ("user", "What is 12 plus 30?")])),
    ("chat_rag", chat([
        ("system", "Answer the question using the context. Answer in at most five words."),
        ("user", "Context: The Eiffel Tower was completed in 1889 for the World's Fair in Paris. "
                 "It is 330 metres tall.\nQuestion: When was the Eiffel Tower completed?")])),
    ("plain_long", "Photosynthesis is the process by which green plants, algae and some bacteria "
                   "convert light energy into chemical energy. During this process, carbon dioxide "
                   "and water are combined to form glucose, and oxygen is released as a by-product. "
                   "The reaction takes place mainly in the"),
    ("plain_list", "Here is a list of fruits: apple, banana, cherry,"),
    ("plain_numbers", "1, 2, 3, 4, 5, 6, 7,"),
    ("plain_recipe", "To make a simple pancake batter, mix one cup of flour with"),
    ("chat_planets", chat([("user", "Name the planets of the solar system in order.")])),
    ("chat_translate", chat([("system", SYSTEM),
                               ("user", "Translate to French: Good morning, how are you?")])),
    ("chat_poem", chat([("user", "Write a short poem about the sea.")])),
  ]

# (text, add_special, parse_special)
TOKENIZE = [
    ("Hello World! The Quick BROWN fox jumps over the lazy dog.", False, False),
    ("Hello", True, False),
    ("In 2024, 1234567890 people paid $3.14159 each; 42% agreed on 07/11/1999.", False, False),
    ("Wait... what?! (yes) [no] {maybe} <tag> a-b_c/d\\e @#&* ~`^| \"quoted\" 'single'", False, False),
    ("a  b   c    d\t\te \t f\t", False, False),
    ("line1\nline2\n\n\nline3\r\nline4\r\n\r\n", False, False),
    ("Café naïve résumé Ångström façade São Paulo Zürich Ærøskøbing", False, False),
    ("日本語のテキストと中文文本，한국어 텍스트。", False, False),
    ("Emoji: 😀🎉👍🏽 ❤️ 🇫🇷 👨‍👩‍👧", False, False),
    ("don't I'll it's we're they've she'd DON'T It'S can't won't y'all", False, False),
    ("def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n\tprint(f(i))\n", False, False),
    ("int main() { std::vector<int> v{1,2,3}; return v[0] != 0 ? -1 : 0; }", False, False),
    ("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", False, True),
    ("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", False, False),
    ("<|endoftext|>text after<|im_end|>", True, True),
    ("  leading and trailing spaces  ", False, False),
    (" single leading space", False, False),
    ("trailing newline\n", False, False),
    ("", False, False),
    ("https://example.com/path?q=1&r=two user.name@example.org", False, False),
    ("¿Qué tal? ¡Sí! Ελληνικά Русский текст العربية עברית", False, False),
    ("The year 1999 vs. 2000: 3.5x faster, 10,000,000 rows, -0.001 error", False, False),
]

GEMMA_TOKENIZE = [
    ("<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", True, True),
    ("<start_of_turn>user\nHi there<end_of_turn>\n", False, False),
    ("Tabs\tand    runs     of spaces\n\n\n\nand newlines", False, False),
]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--golden", required=True, type=Path)
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--dump-logits", type=Path)
    ap.add_argument("--chat", choices=sorted(CHAT), default="chatml")
    ap.add_argument("--n-batch", type=int, default=N_CTX)
    a = ap.parse_args()
    global chat
    chat = CHAT[a.chat]
    tokenize_cases = TOKENIZE + (GEMMA_TOKENIZE if a.chat == "gemma" else [])

    llm = llama_cpp.Llama(model_path=str(a.model), n_ctx=N_CTX, n_batch=a.n_batch, n_threads=N_THREADS,
                          n_threads_batch=N_THREADS, logits_all=True, flash_attn=False,
                          seed=0, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llm.n_vocab()

    # Llama.tokenize(text, add_bos, special) calls llama_tokenize(..., add_special=add_bos,
    # parse_special=special).
    tokenize = [{"text": t, "add_special": add, "parse_special": sp,
                 "ids": llm.tokenize(t.encode("utf-8"), add_bos=add, special=sp)}
                for t, add, sp in tokenize_cases]

    greedy = []
    ref_prompts = []
    if a.dump_logits:
        a.dump_logits.mkdir(parents=True, exist_ok=True)
    for name, text in prompts():
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        out, top2, stop = [], [], "length"
        for step in range(N_GEN):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            if step == 0 and a.dump_logits:
                logits.astype("<f4").tofile(a.dump_logits / f"{name}.logits.f32")
            order = np.argsort(-logits, kind="stable")[:2]
            tok = int(order[0])
            top2.append({"ids": [int(order[0]), int(order[1])],
                         "logits": [round(float(logits[order[0]]), 5), round(float(logits[order[1]]), 5)]})
            out.append(tok)
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                stop = "eog"
                break
            llm.eval([tok])
        text_out = llm.detokenize(out, special=True).decode("utf-8", errors="replace")
        greedy.append({"name": name, "text": text, "prompt_ids": ids, "ids": out,
                       "completion": text_out, "stop": stop, "top2": top2})
        ref_prompts.append({"name": name, "text": text, "ids": ids})
        print(f"llamacpp_golden: {name:18s} {len(ids):3d} prompt tokens -> {text_out!r}", file=sys.stderr)

    meta = {
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_commit": os.environ.get("CB_LLAMA_CPP_COMMIT", "unknown"),
        "libllama": os.environ.get("LLAMA_CPP_LIB_PATH", "bundled"),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "model": a.model.name,
        "model_sha256": sha256_file(a.model),
        "n_vocab": n_vocab,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "n_ctx": N_CTX, "n_threads": N_THREADS, "n_gen": N_GEN, "flash_attn": False,
        "kv_cache_type": "f16",
        "sampling": "argmax over the logits (no sampler chain, no repetition penalty)",
        "chat_format": f"{a.chat} built as text (see llamacpp_golden.py); tokenized with "
                       "add_special=True, parse_special=True",
        "n_batch": a.n_batch,
        "regenerate": "scripts/regen_goldens.sh",
    }
    a.golden.write_text(dump({"meta": meta, "tokenize": tokenize, "greedy": greedy}))
    a.prompts.write_text(dump({
        "comment": "Token ids from llama.cpp (tests/oracle/llamacpp_golden.py); "
                   "input of tests/oracle/reference_forward.py. Regenerate with scripts/regen_goldens.sh.",
        "prompts": ref_prompts}))
    print(f"llamacpp_golden: wrote {a.golden} and {a.prompts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
