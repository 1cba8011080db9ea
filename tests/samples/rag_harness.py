"""What the rag_assistant end-to-end tests share: a pass/fail counter and a
runner for the binary with the test model.

    from rag_harness import Rag, check, describe, finish
"""
import json
import os
import subprocess
import sys

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
    sys.stdout.flush()


def describe(rc, out, err):
    return f"rc={rc}\n     stdout: {out[-800:]!r}\n     stderr: {err[-800:]!r}"


def finish():
    """Prints the totals; the process's exit status."""
    print(f"{PASSED} passed, {FAILED} failed")
    return 1 if FAILED else 0


class Rag:
    """rag_assistant with a fixed model and thread count ($CB_MODEL is
    ignored: the test says which model it runs)."""

    def __init__(self, binary, model, threads="2"):
        self.binary = binary
        self.env = dict(os.environ)
        self.env.pop("CB_MODEL", None)
        self.model = ["--model", model] if model else []
        self.threads = threads

    def run(self, args, stdin=None, timeout=300, **popen_args):
        """(exit status, stdout, stderr); popen_args such as user= go to
        subprocess.run."""
        p = subprocess.run([self.binary] + self.model + ["--threads", self.threads] + args,
                           input=stdin, capture_output=True, timeout=timeout, env=self.env,
                           **popen_args)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    def json(self, args):
        rc, out, err = self.run(args + ["--json"])
        try:
            obj = json.loads(out) if rc == 0 else None
        except ValueError:
            obj = None
        return rc, obj, out, err
