#!/usr/bin/env python3
"""check_layering.py fails where it must, on small trees written here.

A storage file (cache/, where the chunk stores live) that includes fusion or
scheduling code (runtime/blend/) is a violation, as is a runtime/ include
cycle; the same trees without those includes pass.

Usage: check_layering_test.py (exits 1 on the first wrong verdict).
"""
import os
import subprocess
import sys
import tempfile

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layering.py")


def verdict(files):
    """check_layering.py's exit status and output on a tree of `files`."""
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
        done = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)
        return done.returncode, done.stdout


BASE = {
    "platform/error.h": "#pragma once\n",
    "cache/chunk_store.h": '#include "platform/error.h"\n',
    "runtime/blend/fusor.h": '#include "cache/chunk_store.h"\n',
    "runtime/blend/loading_controller.h": '#include "runtime/blend/fusor.h"\n',
}
CASES = [
    ("a clean tree", {}, 0, None),
    ("storage including the fusor",
     {"cache/tiered_chunk_store.h": '#include "cache/chunk_store.h"\n#include "runtime/blend/fusor.h"\n'},
     1, "cache/tiered_chunk_store.h: includes runtime/blend/fusor.h"),
    ("storage including scheduling",
     {"cache/tiered_chunk_store.cpp": '#include "runtime/blend/loading_controller.h"\n'},
     1, "cache/tiered_chunk_store.cpp: includes runtime/blend/loading_controller.h"),
    ("a runtime include cycle",
     {"runtime/blend/fusor.h": '#include "runtime/blend/loading_controller.h"\n'},
     1, "runtime/ include cycle"),
]


def main():
    failed = 0
    for name, extra, want_rc, want_text in CASES:
        rc, out = verdict({**BASE, **extra})
        ok = rc == want_rc and (want_text is None or want_text in out)
        print(f"{'ok' if ok else 'WRONG'}: {name}: exit {rc}" + ("" if ok else f"\n{out}"))
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
