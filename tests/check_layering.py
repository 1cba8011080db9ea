#!/usr/bin/env python3
"""The tree's include rules, checked from the sources.

Dependencies point one way: platform <- kernels <- runtime <- abi <- samples,
and platform <- cache <- runtime.  cache/ holds the storage layer (the
chunk stores and their tiers), so storage never includes fusion or
scheduling code (runtime/blend/); check_layering_test.py shows that a file
doing so fails here.  The samples see only the public C API
(abi/include), samples/common and platform's utilities, never the engine.  Inside runtime/ no two
modules (foo.h with foo.cpp) include each other, directly or through others.

Usage: check_layering.py SOURCE_DIR.  Prints every violation; exits 1 if any.
"""
import os
import re
import sys

ALLOWED = {
    "platform": {"platform"},
    "kernels": {"platform", "kernels"},
    "cache": {"platform", "cache"},
    "runtime": {"platform", "kernels", "cache", "runtime"},
    "abi": {"platform", "kernels", "cache", "runtime", "abi"},
    # The samples use the public C API and platform's utilities (SQLite).
    "samples": {"samples", "abi", "platform"},
}
# Where quoted includes are looked up, after the including file's directory.
INCLUDE_DIRS = ["", "abi/include", "samples/common"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE = (".h", ".cpp", ".cu", ".c")


def sources(root):
    for top in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(SOURCE):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def resolve(root, src, inc):
    """The included file, relative to root: beside src, else on INCLUDE_DIRS."""
    for base in [os.path.dirname(src)] + INCLUDE_DIRS:
        path = os.path.normpath(os.path.join(base, inc))
        if os.path.exists(os.path.join(root, path)):
            return path
    return os.path.normpath(inc)


def find_cycle(graph):
    """One cycle of the module graph as a list of nodes, or None."""
    state = {}
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def main():
    root = sys.argv[1]
    errors = []
    runtime_modules = {}
    for src in sorted(sources(root)):
        layer = src.split(os.sep)[0]
        with open(os.path.join(root, src), encoding="utf-8") as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            target = resolve(root, src, inc)
            target_layer = target.split(os.sep)[0]
            if target_layer not in ALLOWED[layer]:
                errors.append(f"{src}: includes {inc} ({target_layer} is above or beside {layer})")
            if layer == "runtime" and target_layer == "runtime":
                a = os.path.splitext(src)[0]
                b = os.path.splitext(target)[0]
                if a != b:
                    runtime_modules.setdefault(a, set()).add(b)
    cycle = find_cycle(runtime_modules)
    if cycle:
        errors.append("runtime/ include cycle: " + " -> ".join(cycle))
    for e in errors:
        print(e)
    print(f"{len(errors)} layering violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
