#!/usr/bin/env bash
# Validates the Kubernetes manifests (base, overlays, and the rendered
# overlays) against the Kubernetes schemas, offline, then checks that the
# checks refuse what they should (validate_test.py). Idempotent: installs
# kubernetes-validate and PyYAML into the project venv only when missing.
#
#   deploy/k8s/validate.sh [--k8s-version 1.31.0] [--renderer auto|kubectl|builtin]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${KINDLING_VENV:-$HOME/.cache/kindling/venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
  "$venv/bin/pip" install --quiet 'kubernetes-validate>=1.31' 'PyYAML>=6'
fi
"$venv/bin/python" "$here/validate.py" "$@"
# The checks of Spark's wire, the driver's rights and the CA's scope refuse
# the weaknesses they are there for (validate_test.py).
cd "$here" && exec "$venv/bin/python" -m unittest -q validate_test
