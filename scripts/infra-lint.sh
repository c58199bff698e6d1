#!/usr/bin/env bash
# Lints the SAM template offline: cfn-lint, then `sam validate` (the SAM transform) and
# `sam validate --lint` (cfn-lint on the transformed template). Part of scripts/test.sh.
#
# Installs pinned aws-sam-cli and cfn-lint from PyPI into <repo>/.venv/sam, a virtualenv of
# their own: SAM CLI pins click, boto3 and pydantic to versions that conflict with moto's
# in <repo>/.venv (scripts/emulator.sh), so the two cannot share one. .venv/sam sits inside
# the git-ignored .venv and is recreated by this script when missing or broken.
#
# No AWS account and no network beyond PyPI (for the install): region and credentials are
# dummies, telemetry is off, and neither validation calls AWS (checked with the network
# blocked; the template names no AWS managed policy in a SAM `Policies` list, the one
# thing `sam validate` would look up in IAM).
#
#   scripts/infra-lint.sh                   # install or check, then lint infra/template.yaml
#   PYTHON=python3.12 scripts/infra-lint.sh # choose the interpreter for a new venv
#
# The same venv has `sam` for building and deploying (README, "Deploying to AWS").
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
repo="$(pwd)"
venv="$repo/.venv/sam"
template="infra/template.yaml"

# Direct pins; bump together (cfn-lint: the version aws-sam-cli requires), then re-run.
SAM_CLI_VERSION="1.170.0"
CFN_LINT_VERSION="1.58.0"
pins=(
    "aws-sam-cli==$SAM_CLI_VERSION"
    "cfn-lint==$CFN_LINT_VERSION"
)

# Transitive pins (constraints only), frozen from a working install.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
cat >"$constraints" <<'EOF'
annotated-types==0.8.0
arrow==1.4.0
attrs==26.1.0
aws-sam-translator==1.115.0
aws_lambda_builders==1.67.0
awscrt==0.38.0
binaryornot==0.6.0
blinker==1.9.0
boto3==1.43.108
boto3-stubs==1.43.126
botocore==1.43.127
botocore-stubs==1.43.126
certifi==2026.10.18
cffi==2.1.1
charset-normalizer==3.5.2
chevron==0.14.0
click==8.1.8
cookiecutter==2.7.1
cryptography==50.0.2
dateparser==1.5.0
docker==7.2.0
Flask==3.1.3
idna==3.20
itsdangerous==2.2.0
Jinja2==3.1.6
jmespath==1.1.0
jsonpatch==1.47
jsonpointer==3.12
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
mpmath==1.3.0
mypy-boto3-apigateway==1.43.100
mypy-boto3-cloudformation==1.43.110
mypy-boto3-ecr==1.43.119
mypy-boto3-iam==1.43.70
mypy-boto3-kinesis==1.43.101
mypy-boto3-lambda==1.43.118
mypy-boto3-s3==1.43.106
mypy-boto3-schemas==1.43.0
mypy-boto3-secretsmanager==1.43.0
mypy-boto3-signer==1.43.0
mypy-boto3-sqs==1.43.0
mypy-boto3-stepfunctions==1.43.117
mypy-boto3-sts==1.43.94
mypy-boto3-xray==1.43.115
networkx==3.6.1
packaging==26.3
pycparser==3.12
pydantic==2.13.5
pydantic_core==2.46.5
Pygments==2.21.0
pyOpenSSL==26.4.0
python-dateutil==2.9.0.post0
python-dotenv==1.2.4
python-slugify==9.2.0
pytz==2026.6
PyYAML==6.0.3
referencing==0.37.0
regex==2026.11.15
requests==2.34.2
rich==15.0.0
rpds-py==2026.9.1
ruamel.yaml==0.19.1
s3transfer==0.19.3
six==1.17.0
sympy==1.14.0
text-unidecode==1.3
tomlkit==0.15.1
types-s3transfer==0.19.3
typing-inspection==0.4.5
typing_extensions==4.16.0
tzdata==2026.6
tzlocal==5.4.4
urllib3==2.8.0
watchdog==4.0.2
Werkzeug==3.1.9
EOF

# Creates or repairs the venv and installs the pins when one differs (scripts/venv.sh).
ensure_venv --label infra-lint --min-python 3.9 --constraints "$constraints" "$venv" "${pins[@]}"

# Offline: dummy region and credentials, no profile, no emulator endpoint, no telemetry.
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
export AWS_REGION="$AWS_DEFAULT_REGION"
export AWS_ACCESS_KEY_ID=lint AWS_SECRET_ACCESS_KEY=lint AWS_SESSION_TOKEN=lint
unset AWS_PROFILE AWS_ENDPOINT_URL
export SAM_CLI_TELEMETRY=0

# Runs a check; prints its output without SAM's feature-toggle chatter; fails with it.
run() {
    local out
    if ! out="$("$@" 2>&1)"; then
        echo "$out" >&2
        echo "infra-lint: FAILED: $*" >&2
        exit 1
    fi
    grep -v -e "Feature Toggle Config" -e "^$" <<<"$out" || true
}

echo "infra-lint: cfn-lint $CFN_LINT_VERSION $template"
run "$venv/bin/cfn-lint" -- "$template"
echo "infra-lint: sam validate (SAM CLI $SAM_CLI_VERSION)"
run "$venv/bin/sam" validate --template-file "$template"
echo "infra-lint: sam validate --lint"
run "$venv/bin/sam" validate --lint --template-file "$template"
echo "infra-lint: $template is clean"
