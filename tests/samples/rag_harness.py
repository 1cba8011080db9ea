"""What the rag_assistant end-to-end tests share: the pass/fail counter of
tests/check_harness.py and a runner for the binary with the test model.

    from rag_harness import Rag, check, describe, finish
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from check_harness import check, describe, finish  # noqa: E402,F401


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
