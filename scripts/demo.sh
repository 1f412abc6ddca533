#!/usr/bin/env bash
# The browser demo: builds the npm package (installing the wasm32 target and wasm-bindgen-cli
# when missing) and serves www/ with it on http://127.0.0.1:PORT/ (PORT defaults to 8080; the
# next free port is taken when it is busy). Stop with Ctrl-C.
#
#   scripts/demo.sh            build, then serve
#   scripts/demo.sh --no-build serve what target/npm/package holds
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in cargo node; do
  if ! command -v "$tool" >/dev/null; then
    echo "demo: $tool is required (Rust through rustup, Node.js 18+)" >&2
    exit 1
  fi
done

if [ "${1:-}" != "--no-build" ]; then
  scripts/build-npm.sh
fi

echo
echo "demo: open the URL below in a browser. With WebGPU (Chrome or Edge 113+, Safari 26+, Firefox"
echo "      141+ on Windows) the ranks run on the GPU; without it on distopt's CPU fallback."
# bench.html (distopt against TensorFlow.js) also needs TF.js, from the test dependencies.
vendor=()
if [ -d tests/js/node_modules/@tensorflow ]; then
  vendor=(/vendor/tfjs/=tests/js/node_modules/@tensorflow)
  echo "      The bench against TensorFlow.js: /bench.html (?R=8&N=20&repeats=5&variants=addN,add)."
fi
exec node scripts/serve.mjs --port "${PORT:-8080}" /=www /pkg/=target/npm/package "${vendor[@]}"
