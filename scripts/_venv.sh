# Shared by scripts/test and scripts/demo (sourced, not run): make sure .venv
# at the repository root exists and holds this project, installed editable
# with its dev and postgres extras.  The install is skipped while
# pyproject.toml and constraints.txt are unchanged since the last one.

# The repository root, whatever directory the calling script was started from.
MODTRACE_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODTRACE_VENV="$MODTRACE_REPO/.venv"

_venv_die() {
    echo "$(basename "$0"): $*" >&2
    exit 1
}

_venv_check_python() {
    # $1: a python executable; fails unless it is Python 3.10 or newer.
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null \
        || _venv_die "modtrace needs Python 3.10 or newer; $1 is $("$1" -V 2>&1 || echo unusable)"
}

ensure_venv() {
    local py="${PYTHON:-python3}"
    if [ ! -x "$MODTRACE_VENV/bin/python" ]; then
        command -v "$py" >/dev/null 2>&1 || _venv_die "$py not found; install Python 3.10+ (or set PYTHON=/path/to/python)"
        _venv_check_python "$py"
        echo "creating $MODTRACE_VENV" >&2
        "$py" -m venv "$MODTRACE_VENV" \
            || _venv_die "could not create $MODTRACE_VENV (on Debian/Ubuntu: apt install python3-venv)"
    fi
    _venv_check_python "$MODTRACE_VENV/bin/python"

    local stamp="$MODTRACE_VENV/.modtrace-install" want
    want="$("$MODTRACE_VENV/bin/python" - "$MODTRACE_REPO" <<'PY'
import hashlib, pathlib, sys
repo = pathlib.Path(sys.argv[1])
h = hashlib.sha256()
for name in ("pyproject.toml", "constraints.txt"):
    h.update((repo / name).read_bytes())
print(h.hexdigest())
PY
)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$MODTRACE_VENV/bin/modtrace" ]; then
        return 0
    fi
    echo "installing modtrace into $MODTRACE_VENV (editable, with dev and postgres extras)" >&2
    # constraints.txt pins torch to a CPU build; without it pip may fetch a multi-GB CUDA wheel.
    (cd "$MODTRACE_REPO" && "$MODTRACE_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -c constraints.txt -e '.[dev,postgres]') \
        || _venv_die "installing modtrace into $MODTRACE_VENV failed (see pip's output above)"
    echo "$want" > "$stamp"
}
