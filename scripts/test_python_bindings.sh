#!/usr/bin/env bash
# Tests the Python bindings (bindings/python) against a build's library:
#
#   scripts/test_python_bindings.sh BUILD_DIR
#
# Creates the virtual environment BUILD_DIR/python-venv if needed, installs
# pytest and the bindings package into it (again only when the package's
# files changed), then runs bindings/python/tests on the installed package
# with CACHEBLEND_LIBRARY=BUILD_DIR/lib/libcacheblend.so.0.  The exit status
# is pytest's.  $PYTHON picks the interpreter (default python3); $CB_MODEL
# the model (default models/SmolLM2-135M-Instruct.Q4_1.gguf).
set -euo pipefail

PYTEST_VERSION=8.3.4

say() { echo "python-bindings: $*"; }

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ ! -d "$1" ]; then
  say "no build directory $1: build first (make build)"
  exit 2
fi
BUILD_DIR="$(cd "$1" && pwd)"
LIB="$BUILD_DIR/lib/libcacheblend.so.0"
if [ ! -f "$LIB" ]; then
  say "no $LIB: build the library first (make build)"
  exit 2
fi
VENV="$BUILD_DIR/python-venv"

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  rm -rf "$VENV"  # a broken one, e.g. its Python was removed: start over, stamp included
  if ! "${PYTHON:-python3}" -m venv "$VENV"; then
    say "could not create a virtual environment (on Debian/Ubuntu: apt-get install python3-venv)"
    rm -rf "$VENV"
    exit 2
  fi
fi

# The stamp names the pytest version and a hash of what the package is
# built from, so an edit to the bindings reinstalls them.
package_hash() {
  (cd "$ROOT/bindings/python" &&
    { find pyproject.toml setup.py README.md cacheblend -type f \( -name '*.py' -o -name '*.toml' -o -name '*.md' \) |
      LC_ALL=C sort | xargs sha256sum; sha256sum "$LIB"; } | sha256sum | cut -d' ' -f1)
}
stamp="$VENV/cacheblend-bindings.stamp"
want="pytest==$PYTEST_VERSION $(package_hash)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  say "installing pytest==$PYTEST_VERSION and bindings/python into $VENV"
  rm -f "$stamp"
  # Built from a copy: setuptools builds in the source directory, where a
  # build/ left from an earlier version could slip stale modules into the wheel.
  src="$(mktemp -d)"
  trap 'rm -rf "$src"' EXIT
  cp -r "$ROOT/bindings/python/pyproject.toml" "$ROOT/bindings/python/setup.py" \
    "$ROOT/bindings/python/README.md" "$ROOT/bindings/python/cacheblend" "$src/"
  rm -rf "$src/cacheblend/__pycache__"
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      "pytest==$PYTEST_VERSION" ||
    ! CACHEBLEND_LIBRARY="$LIB" "$VENV/bin/python" -m pip install --quiet \
      --disable-pip-version-check --force-reinstall --no-deps "$src"; then
    say "pip install failed"
    exit 2
  fi
  echo "$want" >"$stamp"
else
  say "$VENV is up to date"
fi

# The installed package carries the library it was built with: it loads with
# no environment variable, from outside the checkout.
bundled=$(cd / && env -u CACHEBLEND_LIBRARY "$VENV/bin/python" -c \
  'import cacheblend; print(cacheblend.library_path)') || {
  say "the installed package does not import without CACHEBLEND_LIBRARY"
  exit 1
}
case "$bundled" in
  "$VENV"/*) say "imports with no environment variable: $bundled" ;;
  *) say "the installed package loaded $bundled, not its bundled copy"; exit 1 ;;
esac

say "running bindings/python/tests with CACHEBLEND_LIBRARY=$LIB"
cd "$ROOT"
# From the source root, where no cacheblend/ directory shadows the installed package.
status=0
# No pytest cache: it would be written into the source tree.
CACHEBLEND_LIBRARY="$LIB" "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  bindings/python/tests || status=$?
say "pytest exit status $status"
exit "$status"
