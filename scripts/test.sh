#!/usr/bin/env bash
# The whole test suite: what CI runs (.ci/run) and what the README calls "test it".
# Builds the airlock binary with test-only failpoints, then runs every test in debug.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

echo "== fmt"
cargo fmt --all -- --check

echo "== build the test binary (failpoints compiled in)"
cargo build -p airlock-local --features failpoints
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
cp "$target_dir/debug/airlock" "$target_dir/debug/airlock-failpoints"

echo "== tests"
cargo test --workspace
