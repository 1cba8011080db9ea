#!/usr/bin/env bash
# Creates (idempotently) the Python virtualenv the test oracles run in:
# ${CB_CACHE_DIR:-~/.cache/cacheblend-rt}/venv with the pinned numpy and gguf
# (tests/oracle/pins.sh).  An existing venv is converged to the pins.  When it
# is already up to date this only compares a stamp file (no Python start-up).
#
#   scripts/oracle_venv.sh                 ensure; the venv's python is the last line
#   scripts/oracle_venv.sh --print-python  ensure; print only the venv's python
#
# CB_PYTHON picks the interpreter the venv is created from (default: python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../tests/oracle/pins.sh
source "$ROOT/tests/oracle/pins.sh"
CACHE_DIR="${CB_CACHE_DIR:-$HOME/.cache/cacheblend-rt}"
VENV="$CACHE_DIR/venv"
PY="$VENV/bin/python"
WANT="numpy==$CB_PIN_NUMPY gguf==$CB_PIN_GGUF"
STAMP="$VENV/.cb-pins"

quiet=0
case "${1:-}" in
  --print-python) quiet=1 ;;
  "") ;;
  *) echo "usage: $0 [--print-python]" >&2; exit 2 ;;
esac
log() { [ "$quiet" = 1 ] || echo "oracle_venv: $*" >&2; }

up_to_date() { [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; }

if ! up_to_date; then
  mkdir -p "$CACHE_DIR"
  # Serialize concurrent callers (ctest -j); re-check once the lock is held.
  exec 9>"$CACHE_DIR/.venv.lock"
  flock 9
  if ! up_to_date; then
    if [ ! -x "$PY" ] || ! "$PY" -c 'import sys' 2>/dev/null; then
      log "creating $VENV"
      rm -rf "$VENV"
      "${CB_PYTHON:-python3}" -m venv "$VENV" || {
        echo "oracle_venv: cannot create a venv (on Debian: apt-get install python3-venv)" >&2; exit 1; }
    fi
    log "installing $WANT"
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --disable-pip-version-check $WANT >&2
    "$PY" - "$CB_PIN_NUMPY" "$CB_PIN_GGUF" <<'PYEOF'
import sys
from importlib.metadata import version
import numpy, gguf, gguf.quants  # noqa: F401  (import check)
got = (version("numpy"), version("gguf"))
if got != (sys.argv[1], sys.argv[2]):
    sys.exit(f"oracle_venv: venv has numpy {got[0]}, gguf {got[1]}; wanted {sys.argv[1]}, {sys.argv[2]}")
PYEOF
    echo "$WANT" >"$STAMP"
    log "ready"
  fi
fi
echo "$PY"
