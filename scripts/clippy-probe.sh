#!/usr/bin/env bash
# Proves that the lint gate of scripts/test.sh is live: a throwaway crate with a clippy
# warning, built the way test.sh builds the workspace (RUSTC_WORKSPACE_WRAPPER set to
# clippy-driver, CLIPPY_ARGS denying warnings), must fail to build, and the same crate
# without the warning must build. Run by test.sh; a few seconds.
set -euo pipefail
: "${RUSTC_WORKSPACE_WRAPPER:?set RUSTC_WORKSPACE_WRAPPER to clippy-driver first}"
: "${CLIPPY_ARGS:?set CLIPPY_ARGS first}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/src"
cat >"$dir/Cargo.toml" <<'TOML'
[package]
name = "clippy-probe"
version = "0.0.0"
edition = "2021"

[workspace]
TOML
build() {
    CARGO_TARGET_DIR="$dir/target" cargo build --quiet --offline --manifest-path "$dir/Cargo.toml" 2>"$dir/out"
}
echo 'fn main() { let v = vec![1u8]; println!("{}", len(&v)); } fn len(v: &Vec<u8>) -> usize { v.len() }' >"$dir/src/main.rs"
if build; then
    echo "clippy-probe: a clippy warning (ptr_arg) built without error: the lint gate is not live" >&2
    exit 1
fi
if ! grep -q "clippy::ptr.arg" "$dir/out"; then
    echo "clippy-probe: the probe failed for another reason than the lint:" >&2
    cat "$dir/out" >&2
    exit 1
fi
echo 'fn main() { let v = vec![1u8]; println!("{}", len(&v)); } fn len(v: &[u8]) -> usize { v.len() }' >"$dir/src/main.rs"
if ! build; then
    echo "clippy-probe: the clean probe did not build:" >&2
    cat "$dir/out" >&2
    exit 1
fi
echo "clippy-probe: the lint gate is live (clippy-driver denies warnings in workspace crates)"
