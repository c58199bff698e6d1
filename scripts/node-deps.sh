#!/usr/bin/env bash
# Installs the Node packages the tests use, each exactly as pinned in its package-lock.json:
#   tests/mcp   the MCP test clients (@mastra/mcp, the official TypeScript SDK 1.x and 2.x client)
#   tests/a11y  axe-core, which the browser tests inject into every approval page
#
# Idempotent and fast when up to date: `npm ci` runs in a dir only when its node_modules is
# missing or was installed from a different package.json/package-lock.json (a stamp file
# inside node_modules records their sha256). Needs node (>= 20) and npm, and the npm
# registry (or a warm npm cache) when it has to install.
#
#   scripts/node-deps.sh         # install or check; prints the node and npm versions
#
# The tests run `node tests/mcp/clients.mjs <scenario> <url>` (see that file's header) and
# read tests/a11y/node_modules/axe-core/axe.min.js.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

for tool in node npm; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "node-deps: '$tool' is not on PATH; install Node.js 20 or newer with npm" >&2
        exit 1
    fi
done
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if (( node_major < 20 )); then
    echo "node-deps: node $(node --version) is too old; the tests need Node.js 20 or newer" >&2
    exit 1
fi

# install <dir under tests/> <node script that fails if the tree does not load>
install() {
    local name="$1" check="$2"
    local dir="$root/tests/$name"
    local stamp="$dir/node_modules/.airlock-deps-stamp"
    local want
    want="$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -d' ' -f1) node$node_major"
    if [[ -d "$dir/node_modules" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        echo "node-deps: tests/$name/node_modules is up to date (node $(node --version), npm $(npm --version))"
        return 0
    fi
    echo "node-deps: installing tests/$name dependencies with npm ci (node $(node --version), npm $(npm --version))"
    rm -f "$stamp"
    # --ignore-scripts: none of the pinned packages needs an install script; --no-audit/--no-fund:
    # no extra registry calls. Engine warnings (some Mastra packages declare node >= 22) are
    # expected.
    if ! npm ci --prefix "$dir" --ignore-scripts --no-audit --no-fund --loglevel=error; then
        echo "node-deps: npm ci failed in $dir" >&2
        exit 1
    fi
    # fail loudly if the tree does not load (e.g. a broken or partial install)
    if ! (cd "$dir" && node --input-type=module -e "$check" >/dev/null); then
        echo "node-deps: tests/$name dependencies were installed but do not load" >&2
        exit 1
    fi
    echo "$want" >"$stamp"
}

install mcp "
await import('@mastra/mcp');
await import('@modelcontextprotocol/sdk/client/index.js');
await import('@modelcontextprotocol/client');
"
install a11y "
import { readFileSync } from 'node:fs';
const src = readFileSync('node_modules/axe-core/axe.min.js', 'utf8');
if (!src.includes('axe.run') && !src.includes('.run=')) throw new Error('axe.min.js has no run');
"
echo "node-deps: done"
