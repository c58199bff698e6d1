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
# shellcheck source=scripts/venv.sh
source scripts/venv.sh

# Bump together, then re-run this script.
CARGO_LAMBDA_VERSION="1.9.2"
ZIGLANG_VERSION="0.15.2"
pins=(
    "cargo-lambda==$CARGO_LAMBDA_VERSION"
    "ziglang==$ZIGLANG_VERSION"
)
TARGET="aarch64-unknown-linux-gnu"

# Creates or repairs the venv and installs the pins when one differs (scripts/venv.sh).
ensure_venv --label lambda-build "$venv" "${pins[@]}"

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
