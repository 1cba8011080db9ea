#!/usr/bin/env python3
"""Command-line tests of cb_bench (DESIGN.md §6).

  test_cb_bench.py --bench build/bin/cb_bench --model models/X.gguf

$CB_MODEL, when set, overrides --model.  Checks the chat answer, the --json
output, and that bad input (truncated / wrong-magic / absurd model files, a
prompt longer than the context, a missing file, bad flags) gives a one-line
"cb_bench: error: " message and exit status 1 (2 for usage errors), never a
crash.  Prints "N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

PASSED = 0
FAILED = 0


def check(cond, what, detail=""):
    global PASSED, FAILED
    if cond:
        PASSED += 1
        print(f"ok   {what}")
    else:
        FAILED += 1
        print(f"FAIL {what}" + (f"\n     {detail}" if detail else ""))


def run(bench, args, env=None, timeout=300):
    e = dict(os.environ)
    e.pop("CB_MODEL", None)
    if env:
        e.update(env)
    p = subprocess.run([bench] + args, capture_output=True, timeout=timeout, env=e)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def describe(rc, out, err):
    return f"rc={rc}\n     stdout: {out[-600:]!r}\n     stderr: {err[-600:]!r}"


def expect_error(bench, args, what, code=1, must_contain=None, env=None):
    rc, out, err = run(bench, args, env=env)
    lines = [l for l in err.splitlines() if l.strip()]
    ok = (rc == code and len(lines) == 1 and lines[0].startswith("cb_bench: error: ")
          and (must_contain is None or must_contain.lower() in lines[0].lower()))
    check(ok, what, describe(rc, out, err))
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    bench = a.bench
    model = os.environ.get("CB_MODEL") or a.model
    common = ["--model", model, "--threads", "2"]

    # The chat answer.
    rc, out, err = run(bench, ["generate", "--chat", "--prompt", "What is the capital of France?",
                               "--max-tokens", "16"] + common)
    check(rc == 0 and "Paris" in out, "generate --chat answers Paris", describe(rc, out, err))

    # --json: one object with the contract's fields.
    rc, out, err = run(bench, ["generate", "--chat", "--prompt", "What is the capital of France?",
                               "--max-tokens", "16", "--json"] + common)
    obj = None
    try:
        lines = [l for l in out.splitlines() if l.strip()]
        obj = json.loads(lines[0]) if len(lines) == 1 else None
    except (ValueError, IndexError):
        obj = None
    check(rc == 0 and isinstance(obj, dict), "generate --json prints one JSON object",
          describe(rc, out, err))
    if isinstance(obj, dict):
        fields = {"bench": str, "mode": str, "threads": int, "model": str, "text": str,
                  "tokens": list, "n_prompt": int, "ttft_ms": (int, float), "tok_s": (int, float)}
        missing = [k for k, t in fields.items() if not isinstance(obj.get(k), t)]
        check(not missing, "generate --json has the required fields", f"missing/bad: {missing}")
        check(obj.get("bench") == "generate" and obj.get("mode") == "full"
              and obj.get("threads") == 2, "generate --json bench/mode/threads values", str(obj))
        check("Paris" in obj.get("text", "") and all(isinstance(t, int) for t in obj["tokens"])
              and 0 < len(obj["tokens"]) <= 16, "generate --json text and token ids", str(obj))

    # prefill / decode --json (small sizes, fast).
    for cmd, extra, keys in (("prefill", ["--tokens", "32", "--repeat", "1"], ["tok_s", "ms"]),
                             ("decode", ["--tokens", "4", "--ctx", "8"], ["tok_s"])):
        rc, out, err = run(bench, [cmd] + extra + ["--json"] + common)
        try:
            obj = json.loads(out)
        except ValueError:
            obj = None
        ok = (rc == 0 and isinstance(obj, dict) and obj.get("bench") == cmd
              and all(isinstance(obj.get(k), (int, float)) and obj[k] > 0 for k in keys)
              and obj.get("mode") == "full" and obj.get("threads") == 2 and obj.get("model"))
        check(ok, f"{cmd} --json", describe(rc, out, err))
    rc, out, err = run(bench, ["prefill", "--tokens", "16", "--repeat", "1"] + common)
    check(rc == 0 and "tok/s" in out, "prefill prints a table", describe(rc, out, err))

    # Help and usage errors (exit 2).
    rc, out, err = run(bench, ["--help"])
    check(rc == 0 and "generate" in out and "--threads" in out, "--help", describe(rc, out, err))
    expect_error(bench, [], "no command", code=2)
    expect_error(bench, ["frobnicate"], "unknown command", code=2, must_contain="frobnicate")
    expect_error(bench, ["generate", "--prompt", "x", "--bogus"] + common, "unknown flag", code=2,
                 must_contain="--bogus")
    expect_error(bench, ["generate", "--prompt"], "missing value", code=2,
                 must_contain="needs a value")
    expect_error(bench, ["generate", "--prompt", "x", "--max-tokens", "12abc"] + common,
                 "bad number", code=2, must_contain="--max-tokens")
    expect_error(bench, ["prefill", "--tokens", "-3"] + common, "negative count", code=2)
    expect_error(bench, ["generate", "--prompt", "x", "--top-p", "nan"] + common, "NaN", code=2)
    expect_error(bench, ["generate", "--max-tokens", "3"] + common, "missing --prompt", code=2,
                 must_contain="--prompt")

    # Runtime errors (exit 1).
    with tempfile.TemporaryDirectory() as tmp:
        missing = os.path.join(tmp, "nope.gguf")
        expect_error(bench, ["generate", "--prompt", "x", "--model", missing], "missing model file",
                     must_contain="nope.gguf")
        # The default path, relative to the cwd, and CB_MODEL are both named.
        p = subprocess.run([os.path.abspath(bench), "generate", "--prompt", "x"],
                           capture_output=True, cwd=tmp, text=True,
                           env={k: v for k, v in os.environ.items() if k != "CB_MODEL"})
        check(p.returncode == 1 and p.stderr.startswith("cb_bench: error: ")
              and "CB_MODEL" in p.stderr and "models/SmolLM2-135M-Instruct.Q4_1.gguf" in p.stderr,
              "missing default model names CB_MODEL and the default path",
              describe(p.returncode, p.stdout, p.stderr))
        expect_error(bench, ["generate", "--prompt", "x"], "missing CB_MODEL file",
                     must_contain="nope.gguf", env={"CB_MODEL": missing})

        with open(model, "rb") as f:
            head = f.read(1 << 20)
        size = os.path.getsize(model)

        def variant(name, data):
            p = os.path.join(tmp, name)
            with open(p, "wb") as f:
                f.write(data)
            return p

        bad_files = [("truncated to 1000 bytes", variant("t1000.gguf", head[:1000]))]
        half = os.path.join(tmp, "half.gguf")
        with open(model, "rb") as src, open(half, "wb") as dst:
            remaining = size // 2
            while remaining > 0:
                chunk = src.read(min(remaining, 1 << 22))
                if not chunk:
                    break
                dst.write(chunk)
                remaining -= len(chunk)
        bad_files.append(("truncated to half", half))
        bad_files.append(("wrong magic", variant("magic.gguf", b"GGML" + head[4:4096])))
        # A full copy whose tensor count (uint64 at offset 8) is 2^60.
        absurd = os.path.join(tmp, "tensors.gguf")
        shutil.copyfile(model, absurd)
        with open(absurd, "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<Q", 1 << 60))
        bad_files.append(("tensor count 2^60", absurd))
        bad_files.append(("empty file", variant("empty.gguf", b"")))
        bad_files.append(("a directory", tmp))
        for what, path in bad_files:
            expect_error(bench, ["generate", "--prompt", "x", "--max-tokens", "1", "--model", path,
                                 "--threads", "2"], f"bad model: {what}")

        # A prompt longer than the context.
        long_prompt = "The quick brown fox jumps over the lazy dog. " * 20
        expect_error(bench, ["generate", "--prompt", long_prompt, "--n-ctx", "16",
                             "--max-tokens", "4"] + common, "prompt longer than the context",
                     must_contain="context")

    print(f"{PASSED} passed, {FAILED} failed")
    return 0 if FAILED == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
