#!/usr/bin/env bash
# Builds the Lambda functions for AWS Lambda on Graviton (arm64, provided.al2023):
#
#   scripts/lambda-build.sh                  # every function crate under functions/
#   scripts/lambda-build.sh -p accounts      # one function (any `cargo lambda build` flags)
#
# Output: target/lambda/<function>/bootstrap (the target dir honours CARGO_TARGET_DIR).
#
# How: `cargo lambda build --release --arm64` cross-compiles from any host with Zig as the
# C compiler and linker (cargo-zigbuild inside cargo-lambda), so no aarch64 GCC, sysroot
# or Docker is needed; glibc symbols are pinned to what Amazon Linux 2023 provides.
# cargo-lambda and Zig (the `ziglang` wheel) come from PyPI into <repo>/.venv, the same
# virtualenv scripts/emulator.sh makes (each script installs only its own pins, so neither
# breaks the other). The Rust standard library for aarch64-unknown-linux-gnu comes from
# rustup (`rustup target add`), once.
#
# `sam build` (samconfig.toml) runs the same `cargo lambda build --release --arm64 --bin X`
# per function; put .venv/bin on PATH for it (scripts/infra-lint.sh prints how).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
venv="$repo/.venv"
py="$venv/bin/python"
python="${PYTHON:-python3}"

# Bump together, then re-run this script.
CARGO_LAMBDA_VERSION="1.9.2"
ZIGLANG_VERSION="0.15.2"
pins=(
    "cargo-lambda==$CARGO_LAMBDA_VERSION"
    "ziglang==$ZIGLANG_VERSION"
)
TARGET="aarch64-unknown-linux-gnu"

stale() {
    [[ -x "$py" ]] || { echo "no-venv"; return; }
    "$py" - "${pins[@]}" <<'PY' 2>/dev/null || echo "broken-venv"
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        print(f"{name} (have {have}, want {want})")
PY
}

if [[ -x "$py" ]] && ! "$py" -c 'import sys' 2>/dev/null; then
    echo "lambda-build: $venv is broken (its interpreter does not run); recreating it"
    rm -rf "$venv"
fi
if [[ ! -x "$py" ]]; then
    command -v "$python" >/dev/null || { echo "lambda-build: $python not found (set PYTHON=...)" >&2; exit 1; }
    echo "lambda-build: creating $venv with $("$python" --version 2>&1)"
    if ! "$python" -m venv "$venv"; then
        echo "lambda-build: '$python -m venv' failed (no ensurepip?); retrying with --without-pip"
        rm -rf "$venv"
        "$python" -m venv --without-pip "$venv"
    fi
fi

need="$(stale)"
if [[ -n "$need" ]]; then
    echo "lambda-build: installing cargo-lambda and zig from PyPI; out of date:"
    sed 's/^/  /' <<<"$need"
    if ! "$py" -m pip --version >/dev/null 2>&1; then
        "$py" -m ensurepip --default-pip >/dev/null 2>&1 ||
            "$python" -m pip --python "$py" install --quiet --disable-pip-version-check pip || {
            echo "lambda-build: no pip in $venv; install python3-venv, remove $venv, re-run" >&2
            exit 1
        }
    fi
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip install --quiet "${pins[@]}"
    need="$(stale)"
    [[ -z "$need" ]] || { echo "lambda-build: still out of date: $need" >&2; exit 1; }
fi

# cargo-lambda finds Zig as `zig` on PATH or as `python3 -m ziglang`: the venv gives both
# (its python3 has the ziglang module).
export PATH="$venv/bin:$PATH"

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$TARGET"; then
    echo "lambda-build: adding the Rust target $TARGET (rustup)"
    rustup target add "$TARGET"
fi

# Default: every Lambda crate under functions/ (not `airlock`, the local command line, nor
# the tests' binaries).
args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
    for dir in functions/*/; do
        name="$(basename "$dir")"
        if [[ "$name" != local && -f "$dir/Cargo.toml" ]]; then
            args+=(-p "$name")
        fi
    done
fi

echo "lambda-build: $(cargo lambda --version), zig $("$py" -m ziglang version)"
echo "lambda-build: cargo lambda build --release --arm64 ${args[*]}"
cargo lambda build --release --arm64 "${args[@]}"

target_dir="$(cargo metadata --format-version 1 --no-deps | "$py" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
echo "lambda-build: bootstraps in $target_dir/lambda:"
find "$target_dir/lambda" -name bootstrap -printf '  %TY-%Tm-%Td %TH:%TM  %10s bytes  %P\n' 2>/dev/null | sort -k5 || true
