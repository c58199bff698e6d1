#!/usr/bin/env bash
# Installs the local AWS emulator (moto's server mode) that the AWS-backend tests run against:
# a virtualenv at <repo>/.venv with pinned moto[server] and cryptography (KMS ECC signing),
# the AWS CLI v1 in a venv of its own (<repo>/.venv/awscli/bin/aws: .venv/bin is on the
# deploy PATH of README's "Tools", where it would shadow the user's own AWS CLI; the README's
# AWS CLI recipes run with it in tests/tests/e2e/deploy_walk.rs), and libfaketime
# (its wheel ships the x86-64 libfaketime.so.1, linked to <repo>/.venv/lib/libfaketime.so.1):
# the permission proof (tests/tests/e2e/permissions.rs) runs the real Lambda binaries, which
# read only the system clock, at a fixed trading hour; and jq (Debian's, for the recipes).
#
# Idempotent and fast when already installed: pip runs only when an installed version differs
# from a pin. Needs python3 (>= 3.11) and PyPI (scripts/venv.sh does the venv), and root and
# Debian's mirror only when jq is missing.
#
#   scripts/emulator.sh          # install or check; prints the moto version
#   PYTHON=python3.12 scripts/emulator.sh   # choose the interpreter for a new .venv
#
# Then: .venv/bin/moto_server -H 127.0.0.1 -p PORT  (tests/src/moto.rs does this for tests)
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
venv="$repo/.venv"
py="$venv/bin/python"
# shellcheck source=scripts/venv.sh
source scripts/venv.sh

# Direct pins: what the tests rely on. Bump together, then re-run this script.
MOTO_VERSION="5.2.5"
CRYPTOGRAPHY_VERSION="50.0.2"
LIBFAKETIME_VERSION="3.0.1"
AWSCLI_VERSION="1.46.3"
pins=(
    "moto[server]==$MOTO_VERSION"
    "cryptography==$CRYPTOGRAPHY_VERSION"
    "libfaketime==$LIBFAKETIME_VERSION"
)

# Transitive pins (constraints only: a package is installed only if something requires it),
# frozen from a working install so that a fresh machine gets the same server.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
cat >"$constraints" <<'EOF'
annotated-types==0.8.0
antlr4-python3-runtime==4.13.2
attrs==26.1.0
aws-xray-sdk==2.15.0
blinker==1.9.0
boto3==1.44.5
botocore==1.44.5
certifi==2026.10.18
cffi==2.1.1
cfn-lint==1.58.0
charset-normalizer==3.5.2
click==8.5.1
colorama==0.4.6
docker==7.2.0
docutils==0.19
Flask==3.1.3
flask-cors==6.0.5
graphql-core==3.3.2
idna==3.20
itsdangerous==2.2.0
Jinja2==3.1.6
jmespath==1.1.0
joserfc==1.8.0
jsonpatch==1.47
jsonpath-ng==1.16.0
jsonpointer==3.12
jsonschema==4.26.0
jsonschema-path==0.5.0
jsonschema-specifications==2025.9.1
lazy-object-proxy==1.13.0
MarkupSafe==3.0.4
mpmath==1.3.0
networkx==3.6.1
openapi-schema-validator==0.9.0
openapi-spec-validator==0.9.0
pathable==0.6.0
py-partiql-parser==0.6.3
pycparser==3.12
pydantic==2.14.3
pydantic-settings==2.16.3
pydantic_core==2.50.4
pyasn1==0.6.5
pyparsing==3.3.3
python-dateutil==2.9.0.post0
python-dotenv==1.2.4
pytz==2026.6
PyYAML==6.0.3
referencing==0.37.0
regex==2026.11.15
requests==2.34.2
responses==0.26.3
rsa==4.7.2
rfc3339-validator==0.1.4
rpds-py==2026.9.1
s3transfer==0.19.3
six==1.17.0
sympy==1.14.0
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
Werkzeug==3.1.9
wrapt==2.5.2
xmltodict==1.0.4
EOF

# Creates or repairs the venv and installs the pins when one differs (scripts/venv.sh).
ensure_venv --label emulator --min-python 3.11 --constraints "$constraints" "$venv" "${pins[@]}"
# The AWS CLI (its botocore vendored), with the same constraints for its few dependencies.
ensure_venv --label emulator --min-python 3.11 --constraints "$constraints" "$venv/awscli" \
    "awscli==$AWSCLI_VERSION"

if ! "$venv/bin/moto_server" --help >/dev/null 2>&1; then
    echo "emulator: $venv/bin/moto_server --help failed:" >&2
    "$venv/bin/moto_server" --help >&2 || true
    exit 1
fi
if ! "$venv/awscli/bin/aws" --version >/dev/null 2>&1; then
    echo "emulator: $venv/awscli/bin/aws --version failed:" >&2
    "$venv/awscli/bin/aws" --version >&2 || true
    exit 1
fi
# ECC signing for KMS needs a working cryptography backend (a wheel, or a built one).
"$py" -c 'from cryptography.hazmat.primitives.asymmetric import ec; ec.generate_private_key(ec.SECP256R1())' || {
    echo "emulator: cryptography cannot make P-256 keys in $venv" >&2
    exit 1
}

# The preload library, at a path that does not depend on the Python version; it must shift
# the clock of a child process (a library of another architecture would be ignored).
faketime_lib="$("$py" -c 'import importlib.util, os; s = importlib.util.find_spec("libfaketime"); print(os.path.join(os.path.dirname(s.origin), "vendor/libfaketime/src/libfaketime.so.1"))')"
ln -sf "$faketime_lib" "$venv/lib/libfaketime.so.1"
if [[ "$(LD_PRELOAD="$venv/lib/libfaketime.so.1" FAKETIME="-400d" date -u +%Y-%m-%d 2>/dev/null)" \
    == "$(date -u +%Y-%m-%d)" ]]; then
    echo "emulator: $venv/lib/libfaketime.so.1 does not shift the clock of a child process" >&2
    exit 1
fi

# jq: the README's AWS CLI recipes pipe through it (Debian's package, when missing).
if ! command -v jq >/dev/null 2>&1; then
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "emulator: jq is missing and installing it needs root: apt-get install jq" >&2
        exit 1
    fi
    echo "emulator: installing jq (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends jq >/dev/null
fi
jq --version >/dev/null

echo "emulator: moto $("$py" -c 'from importlib.metadata import version as v; print(v("moto"))')" \
    "(cryptography $("$py" -c 'from importlib.metadata import version as v; print(v("cryptography"))'))" \
    "ready: $venv/bin/moto_server; libfaketime: $venv/lib/libfaketime.so.1;" \
    "$("$venv/awscli/bin/aws" --version 2>&1 | cut -d' ' -f1): $venv/awscli/bin/aws"
