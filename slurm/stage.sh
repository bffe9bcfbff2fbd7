#!/usr/bin/env bash
# Copy a file into a node-local job folder when it fits (run by slurm/common.sh, stage_features, once a node).
# Usage: stage.sh FILE DEST_DIR SIZE_BYTES. Exits 1, saying why, when it does not fit; a copy left by an earlier
# attempt of the same job is kept. The copy keeps the file's modification time, so that a run started on the
# copy and resumed on the file itself (or another copy) reads the same input.
set -euo pipefail
src=$1 dest=$2 size=$3
target=$dest/$(basename "$src")
if [ -f "$target" ] && [ "$(stat -c '%s %y' "$target")" = "$(stat -c '%s %y' "$src")" ]; then
    echo "$(hostname): $target already staged"; exit 0
fi
mkdir -p "$dest"
free=$(df --output=avail -B1 "$dest" | tail -n 1)
if (( free < size + size / 10 )); then   # (a tenth spare for what else the node writes)
    echo "$(hostname): $src ($((size >> 20)) MiB) does not fit in $dest ($((free >> 20)) MiB free)"
    rmdir "$dest" 2>/dev/null || true
    exit 1
fi
start=$(date +%s)
part=$target.part-$(hostname)-$$   # (nodes that share this folder each write their own part)
cp --preserve=timestamps "$src" "$part"
mv "$part" "$target"
echo "$(hostname): staged $src to $target ($((size >> 20)) MiB in $(( $(date +%s) - start )) s)"
