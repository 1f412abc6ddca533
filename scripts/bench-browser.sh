#!/usr/bin/env bash
# The browser bench at full size: distopt against TensorFlow.js in Chromium (www/bench.html,
# driven by tests/js/browser-bench.test.js), the figures of docs/performance.md (target 6).
#
#   scripts/bench-browser.sh [R] [log2 N] [repeats] [variants]    (defaults 8 20 5 mean,addN,add)
#
# Needs the npm package (scripts/build-npm.sh) and tests/js/node_modules (.ci/install-js).
# Prints the table and writes the JSON report to target/bench-browser.json. Not a test: the
# figures are whatever this machine gives; only the answers are checked.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
  export XDG_RUNTIME_DIR="$(mktemp -d)"
  chmod 700 "$XDG_RUNTIME_DIR"
fi
export DISTOPT_BENCH_R="${1:-8}" DISTOPT_BENCH_LOG2N="${2:-20}" DISTOPT_BENCH_REPEATS="${3:-5}"
export DISTOPT_BENCH_VARIANTS="${4:-mean,addN,add}"
mkdir -p target
node --test tests/js/browser-bench.test.js | tee target/bench-browser.log | grep -v '^# BENCH_JSON' | sed -n 's/^# //p' | grep -v '^tests\|^suites\|^pass\|^fail\|^cancelled\|^skipped\|^todo\|^duration'
sed -n 's/^# BENCH_JSON //p' target/bench-browser.log > target/bench-browser.json
echo "bench-browser: JSON report in target/bench-browser.json"
