#!/usr/bin/env bash
# Rewrite constraints.txt from .venv: every installed package at its installed version (raypeft
# itself left out), under constraints.txt's own comment header. Run it after the whole suite
# has passed in that venv, so the pins are a set that was tested.
set -euo pipefail
cd "$(dirname "$0")/.."
header=$(grep '^#' constraints.txt)
# torch without its local build label (+cpu): the same pin then matches a CUDA build
pins=$(.venv/bin/pip freeze --exclude-editable --disable-pip-version-check \
  | sed -E 's/^(torch==[^+]+)\+.*/\1/' | LC_ALL=C sort -f)
printf '%s\n%s\n' "$header" "$pins" > constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) pins"
