#!/usr/bin/env python3
"""Writes the llama.cpp golden files the C++ runtime is tested against.

Run through scripts/regen_goldens.sh (it builds the venv with the pinned
llama-cpp-python and points it at the peer's libllama).  Needs llama_cpp.

    llamacpp_golden.py --model M.gguf --golden tests/golden/llamacpp.json
                       --prompts tests/golden/reference_prompts.json [--dump-logits DIR]
                       [--chat chatml|gemma] [--n-batch N] [--prompt-set default|qwen]
                       [--tokenize-set default|qwen] [--chat-template]

llamacpp.json:
  "tokenize": [{"text", "add_special", "parse_special", "ids"}]   llama_tokenize()
  "greedy":   [{"name", "text", "prompt_ids", "ids", "stop", "top2"}]
              ids: up to N_GEN argmax tokens (no sampler, no penalties); generation
              stops after an end-of-generation token (it is included, stop="eog"),
              else stop="length".  top2[i] = {"ids": [a, b], "logits": [la, lb]} of
              the logits that produced ids[i], so a divergence can be shown to be a
              near-tie.
  "chat_template": (with --chat-template) [{"name", "messages", "add_generation_prompt",
              "jinja", "llama_chat_apply_template"}]: each conversation rendered with the
              model file's own tokenizer.chat_template by llama-cpp-python's Jinja2
              formatter (what llama.cpp's server does with --jinja), and by llama.cpp's
              llama_chat_apply_template() (its built-in rendering of the family it
              recognises in that template).
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
--prompt-set qwen: Qwen's greedy prompts (source code, a fill-in-the-middle prompt,
Chinese, ChatML chats with Qwen's default system prompt) in place of the common ones.
--tokenize-set qwen: the Qwen vocabulary's cases (multilingual text, indented code, digit
runs, whitespace runs, Qwen's control and user-defined tokens) after the common ones.
Without these options the files hold what they always held.
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


def default_prompts() -> list[tuple[str, str]]:
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


QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def qwen_prompts() -> list[tuple[str, str]]:
  """Qwen2.5-Coder's: plain text, code, fill-in-the-middle, and ChatML chats, most with the
  system turn Qwen's template adds when a conversation has none."""
  return [
    ("plain_france", "The capital of France is"),
    ("plain_story", "Once upon a time, in a small village at the edge of the forest,"),
    ("plain_numbers", "1, 2, 3, 4, 5, 6, 7,"),
    ("plain_zh", "人工智能是计算机科学的一个分支，它的目标是"),
    ("plain_long", "Photosynthesis is the process by which green plants, algae and some bacteria "
                   "convert light energy into chemical energy. During this process, carbon dioxide "
                   "and water are combined to form glucose, and oxygen is released as a by-product. "
                   "The reaction takes place mainly in the"),
    ("code_fib", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("code_quicksort", "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n"
                       "    pivot = arr[len(arr) // 2]\n"),
    ("code_cpp", "#include <vector>\n\n// Returns the sum of the elements of v.\n"
                 "int sum(const std::vector<int>& v) {\n"),
    ("code_fim", "<|fim_prefix|>def is_prime(n):\n    if n < 2:\n        return False\n"
                 "<|fim_suffix|>\n    return True\n<|fim_middle|>"),
    ("chat_france", chat([("system", QWEN_SYSTEM), ("user", "What is the capital of France?")])),
    ("chat_code", chat([("system", QWEN_SYSTEM),
                        ("user", "Write a Python function that reverses a string.")])),
    ("chat_zh", chat([("system", QWEN_SYSTEM), ("user", "用一句话介绍一下杭州。")])),
    ("chat_rag", chat([
        ("system", "Answer the question using the context. Answer in at most five words."),
        ("user", "Context: The Eiffel Tower was completed in 1889 for the World's Fair in Paris. "
                 "It is 330 metres tall.\nQuestion: When was the Eiffel Tower completed?")])),
    ("chat_multiturn", chat([("system", QWEN_SYSTEM), ("user", "What is 12 plus 30?"),
                             ("assistant", "12 plus 30 is 42."),
                             ("user", "And that times two?")])),
    ("chat_no_system", chat([("user", "Name the planets of the solar system in order.")])),
  ]


PROMPT_SETS = {"default": default_prompts, "qwen": qwen_prompts}

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


# The Qwen vocabulary's (byte-level BPE, llama.cpp's qwen2 pre-tokenizer: a digit is a
# piece of its own, whitespace runs split before their last space or newline).
QWEN_TOKENIZE = [
    ("通义千问是阿里云研发的大语言模型。它可以回答问题、写代码，还能翻译：“你好，世界！”", False, False),
    ("東京は日本の首都です。ひらがな、カタカナ、漢字を混ぜて書きます。ｶﾀｶﾅ（半角）", False, False),
    ("Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю. Ёжик", False, False),
    ("À bientôt! Ça va? Œuvre, crème brûlée, déjà vu, Ñandú, Łódź, İstanbul, Straße", False, False),
    ("emoji 🤖💻🐍 🧑‍💻 👩🏾‍🔬 ✅❌ 🏳️‍🌈 1️⃣ 😀😀😀", False, False),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
     "        if x is None:\n            raise ValueError(\"x is None\")\n"
     "        self.items.append(x)\n", False, False),
    ("#include <vector>\n\ntemplate <typename T>\nT sum(const std::vector<T>& v) {\n  T s{};\n"
     "  for (const auto& x : v) {\n    s += x;  // accumulate\n  }\n  return s;\n}\n", False, False),
    ("if (x) {\n\tif (y) {\n\t\treturn 1;\n\t}\n}\n", False, False),
    ("1234567890 00007 3.14159265358979 1e-10 0x1F2E 2024-06-30T12:34:56Z +1 (555) 123-4567",
     False, False),
    ("12345678901234567890123456789", False, False),
    ("一百二十三 = 123，４５６（全角） Ⅻ ½ ²³ ٣٤٥ x1y22z333", False, False),
    ("a        b\t\t\tc\n\n\n\nd   \n  \n\t\ne   ", False, False),
    ("    ", False, False),
    ("\n", False, False),
    ("\t \t \n \r\n  end  ", False, False),
    ("trailing spaces   ", False, False),
    ("<|im_start|>system\n" + QWEN_SYSTEM + "<|im_end|>\n<|im_start|>user\n写一个快速排序<|im_end|>\n"
     "<|im_start|>assistant\n", True, True),
    ("<|im_start|>system\n" + QWEN_SYSTEM + "<|im_end|>\n<|im_start|>user\n写一个快速排序<|im_end|>\n"
     "<|im_start|>assistant\n", True, False),
    ("<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>", False, True),
    ("<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>", False, False),
    ("<|endoftext|><|im_end|><|im_start|>", True, True),
    (" <|im_start|> spaced <|im_end|> ", False, True),
    ("<|im_start|<|im_end|>>", False, True),
    ("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", False, True),
    ("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", False, False),
    ("unused [PAD151665] token", False, True),
]

TOKENIZE_SETS = {"default": [], "qwen": QWEN_TOKENIZE}

# Conversations for --chat-template: (name, [(role, content)], add_generation_prompt).
CHAT_TEMPLATE_CASES = [
    ("user", [("user", "What is the capital of France?")], True),
    ("system_user", [("system", "Answer in one word."), ("user", "What is the capital of France?")],
     True),
    ("multiturn", [("user", "What is 12 plus 30?"), ("assistant", "42."),
                   ("user", "And that times two?")], True),
    ("system_multiturn", [("system", QWEN_SYSTEM), ("user", "Hi!"), ("assistant", "Hello! How can I help?"),
                          ("user", "Tell me a joke.")], True),
    ("no_generation_prompt", [("user", "Hi!"), ("assistant", "Hello!")], False),
    ("multiline_unicode", [("user", "def f():\n    return 1\n\n这段代码做什么？")], True),
]


def render_chat_templates(llm: llama_cpp.Llama) -> list[dict]:
    """CHAT_TEMPLATE_CASES rendered by the model's Jinja template and by llama.cpp's C API."""
    import ctypes
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    tmpl = llm.metadata.get("tokenizer.chat_template")
    if not tmpl:
        raise SystemExit("llamacpp_golden: --chat-template: the model file has no tokenizer.chat_template")
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def piece(tok: int) -> str:
        return llm.detokenize([tok], special=True).decode("utf-8")

    eos, bos = piece(llama_cpp.llama_vocab_eos(vocab)), piece(llama_cpp.llama_vocab_bos(vocab))

    def c_api(msgs: list[tuple[str, str]], add_ass: bool) -> str:
        keep = [(r.encode(), c.encode()) for r, c in msgs]
        arr = (llama_cpp.llama_chat_message * len(keep))()
        for i, (r, c) in enumerate(keep):
            arr[i].role, arr[i].content = r, c
        n = llama_cpp.llama_chat_apply_template(tmpl.encode(), arr, len(keep), add_ass, None, 0)
        if n < 0:
            raise SystemExit("llamacpp_golden: llama_chat_apply_template does not know this template")
        buf = ctypes.create_string_buffer(n + 1)
        llama_cpp.llama_chat_apply_template(tmpl.encode(), arr, len(keep), add_ass, buf, n + 1)
        return buf.raw[:n].decode("utf-8")

    out = []
    for name, msgs, add_gen in CHAT_TEMPLATE_CASES:
        jinja = Jinja2ChatFormatter(tmpl, eos_token=eos, bos_token=bos, add_generation_prompt=add_gen)
        out.append({"name": name, "messages": [{"role": r, "content": c} for r, c in msgs],
                    "add_generation_prompt": add_gen,
                    "jinja": jinja(messages=[{"role": r, "content": c} for r, c in msgs]).prompt,
                    "llama_chat_apply_template": c_api(msgs, add_gen)})
    return out


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
    ap.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="default")
    ap.add_argument("--tokenize-set", choices=sorted(TOKENIZE_SETS), default="default")
    ap.add_argument("--chat-template", action="store_true",
                    help="record the model's chat template renderings (\"chat_template\")")
    a = ap.parse_args()
    global chat
    chat = CHAT[a.chat]
    tokenize_cases = (TOKENIZE + (GEMMA_TOKENIZE if a.chat == "gemma" else [])
                      + TOKENIZE_SETS[a.tokenize_set])

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
    for name, text in PROMPT_SETS[a.prompt_set]():
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
    if a.prompt_set != "default" or a.tokenize_set != "default":
        meta.update(prompt_set=a.prompt_set, tokenize_set=a.tokenize_set)
    doc = {"meta": meta, "tokenize": tokenize, "greedy": greedy}
    if a.chat_template:
        doc["chat_template"] = render_chat_templates(llm)
    a.golden.write_text(dump(doc))
    a.prompts.write_text(dump({
        "comment": "Token ids from llama.cpp (tests/oracle/llamacpp_golden.py); "
                   "input of tests/oracle/reference_forward.py. Regenerate with scripts/regen_goldens.sh.",
        "prompts": ref_prompts}))
    print(f"llamacpp_golden: wrote {a.golden} and {a.prompts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
