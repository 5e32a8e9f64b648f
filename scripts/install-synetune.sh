#!/usr/bin/env bash
# Create .venv-synetune: syne-tune in a venv of its own (benchmarks/synetune, docs/synetune.md).
# syne-tune 0.16.0 pulls xgboost (with NVIDIA's NCCL wheel), statsmodels and scikit-learn,
# which raypeft never needs, so raypeft's .venv stays without them; its serialize needs
# fastparquet and its blackbox_repository imports huggingface_hub (0.16.0 has no extra for
# them). About a minute and 1.2 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv-synetune/bin/python ] || "$PYTHON" -m venv .venv-synetune
# this machine's pip config names index folders that may be absent: drop that noise only
.venv-synetune/bin/pip install --quiet --disable-pip-version-check \
  syne-tune==0.16.0 fastparquet==2026.9.0 huggingface_hub==2.4.0 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
.venv-synetune/bin/python -c "import syne_tune; print('syne-tune', syne_tune.__version__)"
