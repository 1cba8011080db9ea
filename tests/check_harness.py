"""The pass/fail counter that the command-line tests written in Python share
(tests/abi/test_cb_bench.py, tests/samples/test_*.py):

    sys.path.insert(0, <the tests directory>)
    from check_harness import check, describe, finish
"""
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


def finish(note=""):
    """Prints the totals (and `note`); the process's exit status."""
    print(f"{PASSED} passed, {FAILED} failed{note}")
    return 1 if FAILED else 0
