#!/usr/bin/env bash
# Runs the whole suite the way CI meets it on a new machine: a fresh clone of this repository's
# committed HEAD (or the ref given) in a temporary folder, with an empty cargo target folder and
# an EMPTY npm cache, then `bash .ci/run` there with CI=true and no standard input. A warm cache
# on this machine can hide a missing install step; this cannot. Run it before resolving an issue
# that touches installs or dependencies (.ci/, scripts/, Cargo.toml/lock, package*.json, npm/).
#
#   scripts/fresh-check.sh [REF]      # default: HEAD; uncommitted changes are NOT included
#
# It prints the elapsed time and keeps the clone and its log on failure (deletes them on success).
# System packages (apt), rustup toolchains and cargo's registry cache are shared with this
# machine: CI's machine installs those through .ci/run itself.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
ref="${1:-HEAD}"
work="$(mktemp -d "${TMPDIR:-/tmp}/distopt-fresh.XXXXXX")"
log="$work/ci.log"

git clone --quiet --no-hardlinks "$repo" "$work/distopt"
git -C "$work/distopt" checkout --quiet --detach "$(git -C "$repo" rev-parse "$ref")"
# CI lays a read-only copy of shared/ beside the clone; give the clone the same neighbour.
if [ -d "$repo/../shared" ]; then ln -s "$(cd "$repo/../shared" && pwd)" "$work/shared"; fi
mkdir "$work/npm-cache"

echo "fresh-check: $(git -C "$work/distopt" log --oneline -1) in $work/distopt"
echo "fresh-check: npm cache $work/npm-cache (empty), target/ empty; log in $log"
start=$(date +%s)
status=0
(
  cd "$work/distopt"
  export npm_config_cache="$work/npm-cache" CI=true
  bash .ci/run </dev/null
) >"$log" 2>&1 || status=$?
elapsed=$(( $(date +%s) - start ))
tail -n 25 "$log"
if [ "$status" -ne 0 ]; then
  echo "fresh-check: FAILED (exit $status) after ${elapsed}s; the clone and log stay in $work"
  exit "$status"
fi
echo "fresh-check: passed in ${elapsed}s (.ci/run from a fresh clone, empty npm cache)"
rm -rf "$work"
