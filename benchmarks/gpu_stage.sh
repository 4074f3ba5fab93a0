#!/usr/bin/env bash
# Sends a folder too large for one call (e.g. CIFAR-10's 133 MB; a lent GPU
# machine takes the working tree plus carried paths up to 64 MiB a call) in
# parts over several calls to the same warm machine (docs/engine.md, "Long runs
# on a remote GPU machine").
#
#   bash benchmarks/gpu_stage.sh split SRC_DIR NAME [PART_SIZE]
#       here: tar SRC_DIR and cut it into .stage/NAME/part.00, part.01, ...
#       (PART_SIZE as split -b takes it, default 30M) with .stage/NAME/MANIFEST
#       (the sha256 of every part and of the whole). Prints the carry lists,
#       one call per part.
#   bash benchmarks/gpu_stage.sh collect NAME DEST_DIR
#       there: keeps every part that came in this call (checked against the
#       manifest) under $GPU_STAGE_DIR/NAME (default /tmp/fedjax_stage, kept
#       while the machine stays warm); once all parts are there, joins them,
#       checks the whole and unpacks it into DEST_DIR (DEST_DIR/<SRC_DIR's
#       name>; once: a marker DEST_DIR/.gpu_stage_NAME skips it later). Exit 0
#       when DEST_DIR holds the folder, 3 while parts are missing, 2 on an
#       error (a part that does not match its manifest). Unpack outside the
#       folders a call carries (a carried .data replaces the remote one), e.g.
#       into /tmp/fedjax_data, and copy the carried data folders beside it.
#
# .stage/ is ignored by git (carry it part by part); delete it afterwards.
set -u

usage() { echo "usage: gpu_stage.sh split SRC_DIR NAME [PART_SIZE] | collect NAME DEST_DIR" >&2; exit 2; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STAGE=${GPU_STAGE_ROOT:-$REPO/.stage}  # where split writes and collect reads the parts
MODE=${1:-}; shift || true

case "$MODE" in
split)
  SRC=${1:-}; NAME=${2:-}; SIZE=${3:-30M}
  [ -n "$SRC" ] && [ -n "$NAME" ] || usage
  [ -d "$SRC" ] || { echo "gpu_stage: SRC_DIR $SRC is not a folder" >&2; exit 2; }
  case "$NAME" in *[!A-Za-z0-9_.-]*|.*) echo "gpu_stage: NAME must be letters, digits, _ . - (got '$NAME')" >&2; exit 2 ;; esac
  OUTD="$STAGE/$NAME"
  rm -rf "$OUTD" && mkdir -p "$OUTD" || exit 2
  SRC=$(cd "$SRC" && pwd)
  tar -C "$(dirname "$SRC")" -cf - "$(basename "$SRC")" | split -b "$SIZE" -d -a 2 - "$OUTD/part." \
    || { echo "gpu_stage: tar or split failed (PART_SIZE '$SIZE'?)" >&2; exit 2; }
  ( cd "$OUTD" && {
      echo "whole $(cat part.* | sha256sum | cut -d' ' -f1)"
      for f in part.*; do echo "$f $(sha256sum "$f" | cut -d' ' -f1)"; done
    } > MANIFEST.tmp && mv MANIFEST.tmp MANIFEST ) || exit 2
  N=$(ls "$OUTD" | grep -c '^part\.')
  echo "gpu_stage: $N parts in $OUTD ($(du -sh "$OUTD" | cut -f1)); one call each, carrying:"
  for f in $(cd "$OUTD" && ls part.*); do echo "  [\".stage/$NAME/$f\", \".stage/$NAME/MANIFEST\"]"; done
  ;;
collect)
  NAME=${1:-}; DEST=${2:-}
  [ -n "$NAME" ] && [ -n "$DEST" ] || usage
  IN="$STAGE/$NAME"; KEEP="${GPU_STAGE_DIR:-/tmp/fedjax_stage}/$NAME"
  mkdir -p "$KEEP" || exit 2
  [ -f "$IN/MANIFEST" ] && cp "$IN/MANIFEST" "$KEEP/MANIFEST"
  [ -f "$KEEP/MANIFEST" ] || { echo "gpu_stage: no manifest for $NAME yet (carry .stage/$NAME/MANIFEST)" >&2; exit 2; }
  want() { awk -v p="$1" '$1 == p {print $2}' "$KEEP/MANIFEST"; }  # a part's sha256
  sum() { sha256sum "$1" | cut -d' ' -f1; }
  FRESH=" "  # the parts this call brought, checked on the way in
  for f in "$IN"/part.*; do
    [ -f "$f" ] || continue
    b=$(basename "$f")
    w=$(want "$b")
    [ -n "$w" ] && [ "$w" = "$(sum "$f")" ] || { echo "gpu_stage: $b does not match the manifest" >&2; exit 2; }
    cp "$f" "$KEEP/$b.tmp" && mv "$KEEP/$b.tmp" "$KEEP/$b" || exit 2
    FRESH="$FRESH$b "
  done
  NEED=$(awk '$1 != "whole" {print $1}' "$KEEP/MANIFEST")
  PARTS=() MISSING=""
  for b in $NEED; do  # a part kept from an earlier split of another manifest is dropped
    case "$FRESH" in
      *" $b "*) ;;
      *) [ -f "$KEEP/$b" ] && [ "$(sum "$KEEP/$b")" != "$(want "$b")" ] && rm -f "$KEEP/$b" ;;
    esac
    [ -f "$KEEP/$b" ] || MISSING="$MISSING $b"
    PARTS+=("$KEEP/$b")
  done
  if [ -n "$MISSING" ]; then
    echo "gpu_stage: $NAME has $((${#PARTS[@]} - $(echo $MISSING | wc -w)))/${#PARTS[@]} parts; missing:$MISSING"
    exit 3
  fi
  whole=$(want whole)
  if [ "$(cat "$DEST/.gpu_stage_$NAME" 2>/dev/null)" = "$whole" ]; then
    echo "gpu_stage: $NAME already unpacked into $DEST"; exit 0
  fi
  [ "$whole" = "$(cat "${PARTS[@]}" | sha256sum | cut -d' ' -f1)" ] \
    || { echo "gpu_stage: the joined parts of $NAME do not match the manifest" >&2; exit 2; }
  mkdir -p "$DEST" && cat "${PARTS[@]}" | tar -C "$DEST" -xf - || exit 2
  echo "$whole" > "$DEST/.gpu_stage_$NAME"
  echo "gpu_stage: $NAME complete, unpacked into $DEST"
  ;;
*) usage ;;
esac
