#!/usr/bin/env bash
# The whole test suite: what CI runs (.ci/run) and what the README calls "test it".
# Installs the AWS emulator (moto) into .venv, Schemathesis into .venv/st (the API fuzzer the
# tests run against `airlock serve`), lints the SAM template (scripts/infra-lint.sh) -- these
# in the background, beside the Rust build -- builds every binary and test with test-only
# failpoints, then runs every test in debug: the end-to-end suite runs against the embedded
# backend and, through moto, the AWS backend.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# The installs and the template lint (network and Python, little of the Rust build's CPU) run
# in the background while cargo builds; the tests start only once they have succeeded. Their
# output is printed whole when they end.
setup_log="$(mktemp)"
setup_pid=
zygote_dir="$(mktemp -d)"
zygote_pid=
cleanup() {
    [ -n "$setup_pid" ] && kill "$setup_pid" 2>/dev/null
    [ -n "$zygote_pid" ] && kill "$zygote_pid" 2>/dev/null && wait "$zygote_pid" 2>/dev/null
    rm -rf "$setup_log" "$zygote_dir"
}
trap cleanup EXIT
(
    set -euo pipefail
    echo "== the AWS emulator (moto, into .venv)"
    scripts/emulator.sh
    echo "== a real browser for the approval page (Debian's chromium and chromium-driver)"
    scripts/browser.sh
    echo "== the Node packages the tests use (MCP clients into tests/mcp, axe-core into tests/a11y; npm ci)"
    scripts/node-deps.sh
    echo "== Schemathesis and the OpenAPI validator (into .venv/st); docs/openapi.json is valid OpenAPI 3.1"
    scripts/schemathesis.sh
    echo "== the SAM template (cfn-lint, sam validate --lint; SAM CLI into .venv/sam)"
    scripts/infra-lint.sh
) >"$setup_log" 2>&1 &
setup_pid=$!
echo "== installs and template lint started in the background (pid $setup_pid)"

echo "== fmt"
cargo fmt --all -- --check

echo "== clippy (every target, warnings are errors): in the build itself"
# `cargo clippy` would check every dependency a second time, in check mode (about 7 minutes
# of a clean run on two cores). Instead every build below runs the workspace's own crates
# through clippy-driver, as `cargo clippy` does (RUSTC_WORKSPACE_WRAPPER, CLIPPY_ARGS), so
# they are linted as they are compiled, the dependencies are compiled once, and the build
# below covers what `cargo clippy --workspace --all-targets` did. The probe proves the lints
# run and fail the build.
clippy_driver="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver)"
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
scripts/clippy-probe.sh

echo "== build every binary and every test (failpoints compiled in; linted as they compile)"
# One cargo run for the binaries and the tests, so the two cores have the whole graph to
# schedule. The failpoints feature is on for the whole workspace: airlock-shared is compiled
# once (not once with failpoints for the `airlock` test binary and once without for the
# Lambda binaries). A failpoint does nothing unless AIRLOCK_FAILPOINTS arms it, and release
# builds (`sam build`, the benchmarks) never have the feature.
features=(--features airlock-local/failpoints)
cargo build --workspace --bins --tests "${features[@]}"
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
cp "$target_dir/debug/airlock" "$target_dir/debug/airlock-failpoints"

echo "== the background installs and template lint"
setup_ok=0
wait "$setup_pid" || setup_ok=$?
setup_pid=
cat "$setup_log"
if [ "$setup_ok" -ne 0 ]; then
    echo "test.sh: the installs or the template lint failed (exit $setup_ok), see above" >&2
    exit 1
fi

echo "== the AWS emulator's zygote (a warmed moto that each AWS test's server is forked from)"
# Starting moto costs about 1.5 s of CPU (imports, first calls); some 130 AWS tests start
# one each. The zygote pays it once; tests/src/moto.rs asks it for a fresh server by fork.
.venv/bin/python scripts/moto_serial.py --zygote "$zygote_dir/moto.sock" >"$zygote_dir/log" 2>&1 &
zygote_pid=$!
for _ in $(seq 1 600); do
    [ -S "$zygote_dir/moto.sock" ] && break
    if ! kill -0 "$zygote_pid" 2>/dev/null; then
        cat "$zygote_dir/log"
        echo "test.sh: the moto zygote exited before it was ready, see above" >&2
        exit 1
    fi
    sleep 0.1
done
[ -S "$zygote_dir/moto.sock" ] || { cat "$zygote_dir/log"; echo "test.sh: no moto zygote after 60 s" >&2; exit 1; }
export AIRLOCK_MOTO_ZYGOTE="$zygote_dir/moto.sock"

echo "== tests"
# cargo-nextest (on the toolchain's machines; .config/nextest.toml) runs the tests of every
# binary side by side; without it, cargo test runs the same tests one binary at a time.
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace "${features[@]}"
else
    echo "(cargo-nextest is not installed: cargo test, one binary at a time)"
    cargo test --workspace "${features[@]}"
fi
