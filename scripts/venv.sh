# shellcheck shell=bash
# A pinned Python virtualenv, made and kept up to date by the scripts that need one
# (scripts/emulator.sh, scripts/infra-lint.sh, scripts/lambda-build.sh). Source it, then:
#
#   ensure_venv [--label NAME] [--min-python X.Y] [--constraints FILE] DIR PKG==VER ...
#
# - Makes DIR with "${PYTHON:-python3}" when it is missing, and remakes it when its
#   interpreter no longer runs (a removed or upgraded base Python).
# - Installs with pip only when an installed version differs from a pin (fast and silent
#   when everything matches), then checks again and fails if a pin still does not match.
# - --constraints FILE: pip constraints (transitive pins; a constrained package is
#   installed only if something requires it).
# - --min-python X.Y: refuses to make a new venv with an older interpreter.
# - --label NAME: prefix of every message (default: the calling script's name).
# - Works on a fresh machine with only python3: without ensurepip (Debian/Ubuntu without
#   python3-venv) it makes the venv --without-pip and bootstraps pip into it.
#
# Several scripts may share one DIR: each installs only its own pins. Returns non-zero
# with a message on stderr on failure (callers run with `set -e`). Needs bash 4+.

# Prints the pins of "$@" whose installed version in venv $1 differs, one per line with what
# is installed; empty when all match. Prints "no-venv" or "broken-venv" when it cannot tell.
_venv_stale() {
    local py="$1/bin/python"
    shift
    [[ -x "$py" ]] || { echo "no-venv"; return 0; }
    "$py" - "$@" <<'PY' 2>/dev/null || echo "broken-venv"
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    name = name.split("[")[0]  # moto[server] -> moto
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        print(f"{name} (have {have}, want {want})")
PY
}

# A venv without pip (made --without-pip, or left half-made by a failed `python3 -m venv`):
# try its ensurepip, else install pip into it from PyPI with the base interpreter's pip.
_venv_ensure_pip() {
    local label="$1" venv="$2" python="$3" py="$2/bin/python" base b
    "$py" -m pip --version >/dev/null 2>&1 && return 0
    echo "$label: $venv has no pip; bootstrapping it"
    "$py" -m ensurepip --default-pip >/dev/null 2>&1 && return 0
    base="$("$py" -c 'import sys; print(sys._base_executable)' 2>/dev/null || echo "$python")"
    for b in "$base" "$python"; do
        "$b" -m pip --python "$py" install --quiet --disable-pip-version-check pip \
            >/dev/null 2>&1 && return 0
    done
    echo "$label: could not bootstrap pip into $venv; install python3-venv" \
        "(Debian: apt-get install python3-venv), remove $venv and re-run" >&2
    return 1
}

ensure_venv() {
    local label min_python="" constraints=""
    label="$(basename "${BASH_SOURCE[1]:-venv}" .sh)"
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --label) label="$2"; shift 2 ;;
            --min-python) min_python="$2"; shift 2 ;;
            --constraints) constraints="$2"; shift 2 ;;
            --) shift; break ;;
            -*) echo "ensure_venv: unknown option $1" >&2; return 2 ;;
            *) break ;;
        esac
    done
    if [[ $# -lt 2 ]]; then
        echo "ensure_venv: usage: ensure_venv [--label NAME] [--min-python X.Y]" \
            "[--constraints FILE] DIR PKG==VER ..." >&2
        return 2
    fi
    local venv="$1"
    shift
    local pins=("$@") pin
    for pin in "${pins[@]}"; do
        [[ "$pin" == *?==?* ]] || { echo "ensure_venv: not a pin (PKG==VER): $pin" >&2; return 2; }
    done
    if [[ -n "$constraints" && ! -r "$constraints" ]]; then
        echo "ensure_venv: constraints file $constraints not readable" >&2
        return 2
    fi
    local py="$venv/bin/python" python="${PYTHON:-python3}" need

    # An interpreter that is there but does not run (also a dangling link to a removed base
    # Python): `python3 -m venv` over it would not repair it, so start again.
    if [[ -e "$py" || -L "$py" ]] && ! "$py" -c 'import sys' >/dev/null 2>&1; then
        echo "$label: $venv is broken (its interpreter does not run); recreating it"
        rm -rf "$venv"
    fi

    if [[ ! -x "$py" ]]; then
        command -v "$python" >/dev/null || {
            echo "$label: $python not found (set PYTHON=...)" >&2
            return 1
        }
        if [[ -n "$min_python" ]]; then
            if ! "$python" -c 'import sys
want = tuple(int(p) for p in sys.argv[1].split("."))
if sys.version_info[:len(want)] < want:
    sys.exit(f"Python {sys.version.split()[0]} is older than {sys.argv[1]}")' "$min_python"; then
                echo "$label: these pins need Python >= $min_python (set PYTHON=python3.X)" >&2
                return 1
            fi
        fi
        echo "$label: creating $venv with $("$python" --version 2>&1)"
        mkdir -p "$(dirname "$venv")"
        if ! "$python" -m venv "$venv"; then
            # Debian/Ubuntu without the python3-venv package have no ensurepip: make the
            # venv without pip; pip is bootstrapped below.
            echo "$label: '$python -m venv' failed (no ensurepip?); retrying with --without-pip"
            rm -rf "$venv"
            "$python" -m venv --without-pip "$venv" || {
                echo "$label: could not create $venv" >&2
                return 1
            }
        fi
    fi

    need="$(_venv_stale "$venv" "${pins[@]}")"
    [[ -z "$need" ]] && return 0

    echo "$label: installing pinned packages into $venv; out of date:"
    sed 's/^/  /' <<<"$need"
    _venv_ensure_pip "$label" "$venv" "$python" || return 1
    local args=(install --quiet)
    [[ -z "$constraints" ]] || args+=(-c "$constraints")
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip "${args[@]}" "${pins[@]}" || {
        echo "$label: pip install failed in $venv" >&2
        return 1
    }
    need="$(_venv_stale "$venv" "${pins[@]}")"
    if [[ -n "$need" ]]; then
        echo "$label: still out of date after pip install:" >&2
        sed 's/^/  /' <<<"$need" >&2
        return 1
    fi
}
