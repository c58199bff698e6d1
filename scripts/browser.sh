#!/usr/bin/env bash
# Installs the headless browser that the browser tests drive (tests/src/browser.rs): Debian's
# `chromium` and `chromium-driver` packages (/usr/bin/chromium, /usr/bin/chromedriver).
#
# Idempotent and fast when already installed: apt runs only when one of the two binaries is
# missing. Needs root (apt-get) and Debian's package mirror; nothing else.
#
#   scripts/browser.sh           # install or check; prints both versions
#
# Tests find the binaries at those paths, or at $AIRLOCK_CHROMIUM / $AIRLOCK_CHROMEDRIVER.
set -euo pipefail

chromium="${AIRLOCK_CHROMIUM:-/usr/bin/chromium}"
chromedriver="${AIRLOCK_CHROMEDRIVER:-/usr/bin/chromedriver}"

if [[ ! -x "$chromium" || ! -x "$chromedriver" ]]; then
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "browser: $chromium or $chromedriver is missing and installing needs root:" >&2
        echo "browser:   apt-get install chromium chromium-driver" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    echo "browser: installing chromium and chromium-driver (apt-get)"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi

for bin in "$chromium" "$chromedriver"; do
    if [[ ! -x "$bin" ]]; then
        echo "browser: $bin is still missing after the install" >&2
        exit 1
    fi
done

# Both must run (a missing shared library shows here, not in the middle of a test).
chromium_version="$("$chromium" --version 2>/dev/null)" || {
    echo "browser: $chromium --version failed:" >&2
    "$chromium" --version >&2 || true
    exit 1
}
chromedriver_version="$("$chromedriver" --version 2>/dev/null)" || {
    echo "browser: $chromedriver --version failed:" >&2
    "$chromedriver" --version >&2 || true
    exit 1
}
echo "browser: $chromium_version ($chromium); $chromedriver_version ($chromedriver)"
