#!/usr/bin/env bash
# Installs Schemathesis (the API fuzzer that tests/tests/e2e/openapi.rs runs against
# `airlock serve`) and openapi-spec-validator (checks docs/openapi.json is valid OpenAPI 3.1)
# from PyPI into <repo>/.venv/st, a virtualenv of their own (their pins of click, pydantic
# and jsonschema differ from moto's and SAM's), then validates docs/openapi.json.
#
# Idempotent and fast when already installed (scripts/venv.sh).
#
#   scripts/schemathesis.sh                      # install or check, validate the document
#   .venv/st/bin/st run --config-file tests/schemathesis/schemathesis.toml URL
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
repo="$(pwd)"
venv="$repo/.venv/st"

# Direct pins; bump together, then re-run.
pins=(
    "schemathesis==4.32.5"
    "openapi-spec-validator==0.9.0"
)

# Transitive pins (constraints only), frozen from a working install.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
cat >"$constraints" <<'PINS'
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.2
click==8.5.1
graphql-core==3.3.2
harfile==0.6.0
hypothesis==6.170.17
hypothesis-graphql==0.13.5
idna==3.20
iniconfig==2.3.1
jsonschema==4.26.0
jsonschema-path==0.5.0
jsonschema-specifications==2025.9.1
jsonschema_rs==0.60.3
lazy-object-proxy==1.13.0
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
openapi-schema-validator==0.9.0
packaging==26.3
pathable==0.6.0
pluggy==1.7.0
pydantic==2.14.4
pydantic-settings==2.16.3
pydantic_core==2.50.5
Pygments==2.21.0
pyrate-limiter==4.5.1
pytest==9.2.0
python-dotenv==1.2.4
PyYAML==6.0.4
referencing==0.37.0
requests==2.34.2
rfc3339-validator==0.1.4
rich==15.0.0
rpds-py==2026.9.1
six==1.17.0
sortedcontainers==2.4.0
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
Werkzeug==3.1.9
PINS

ensure_venv --label schemathesis --min-python 3.10 --constraints "$constraints" "$venv" "${pins[@]}"

"$venv/bin/openapi-spec-validator" docs/openapi.json
