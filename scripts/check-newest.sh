#!/usr/bin/env bash
# Drift check: install the newest releases that pyproject.toml's ranges allow into a temporary
# venv (not constraints.txt's pins) and run the unit and contract suites there. Prints the
# versions it got, then pytest's failures and summary; exits with pytest's code.
#   scripts/check-newest.sh                 # all unit and contract tests
#   scripts/check-newest.sh -k export       # extra arguments go to pytest
# torch stays at constraints.txt's build: the newer torch on PyPI is the CUDA build (GBs of
# wheels); set RAYPEFT_NEWEST_TORCH=1 to let pip pick the newest torch too.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
venv=$(mktemp -d "${TMPDIR:-/tmp}/raypeft-newest.XXXXXX")
trap 'rm -rf "$venv"' EXIT
held="$venv/held.txt"
if [ "${RAYPEFT_NEWEST_TORCH:-0}" = 1 ]; then : > "$held"; else grep -E '^torch==' constraints.txt > "$held"; fi

"$PYTHON" -m venv "$venv"
pip_install() {
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
# a regular (not editable) install: this checkout's editable install in .venv stays as it is;
# the tests import the checkout itself (pytest's pythonpath)
had_build=0; [ -e build ] && had_build=1
pip_install -c "$held" ".[dev,peft]" || { echo "check-newest: install failed"; exit 1; }
[ "$had_build" = 1 ] || rm -rf build  # setuptools' in-tree build folder
pip_install --no-deps -r requirements-offline-assets.txt || { echo "check-newest: assets failed"; exit 1; }

echo "== newest versions the ranges allow (against constraints.txt's pins)"
# torch without its local build label (+cpu), as constraints.txt writes it
"$venv/bin/pip" freeze --disable-pip-version-check 2>/dev/null \
  | sed -E 's/^(torch==[^+]+)\+.*/\1/' | LC_ALL=C sort -f > "$venv/got.txt"
for package in torch transformers peft tokenizers accelerate datasets ray mlflow optuna \
  pyarrow pydantic safetensors numpy; do
  got=$(grep -i "^$package==" "$venv/got.txt" | cut -d= -f3)
  pinned=$(grep -i "^$package==" constraints.txt | cut -d= -f3)
  printf '  %-13s %-10s %s\n' "$package" "${got:-absent}" \
    "$([ "$got" = "$pinned" ] && echo "(= pin)" || echo "(pin ${pinned:-none})")"
done
newer=$(LC_ALL=C comm -13 <(grep '==' constraints.txt | LC_ALL=C sort) \
  <(grep "==" "$venv/got.txt" | grep -v "^raypeft==" | LC_ALL=C sort) || true)
echo "  every package that differs from constraints.txt: ${newer:-none}" | sed '2,$s/^/    /'

echo "== unit and contract suites on the newest set"
workers=()
"$venv/bin/python" -c "import xdist" 2>/dev/null && workers=(-n auto)
RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 \
  "$venv/bin/python" -m pytest tests/unit tests/contract -m "not integration" -q \
  -p no:cacheprovider "${workers[@]}" "$@" 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|error" 
exit "${PIPESTATUS[0]}"
