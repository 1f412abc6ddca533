#!/usr/bin/env bash
# Installs what building the npm package needs, when missing: the wasm32-unknown-unknown rustup
# target and wasm-bindgen-cli at exactly the version given (default: the one crates/distopt-js/Cargo.toml pins).
# Idempotent and quiet when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

VERSION="${1:-$(sed -n 's/^wasm-bindgen = "=\([0-9.]*\)".*/\1/p' crates/distopt-js/Cargo.toml | head -1)}"

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  echo "install-wasm-tools: rustup target add wasm32-unknown-unknown"
  rustup target add wasm32-unknown-unknown
fi

if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$VERSION" ]; then
  echo "install-wasm-tools: cargo install wasm-bindgen-cli --version =$VERSION (a few minutes)"
  # --locked reproduces the CLI's own lockfile; when the registry lacks one of its pinned
  # versions (seen: webpki-roots 1.0.11), fall back to a fresh resolution.
  if ! cargo install wasm-bindgen-cli --version "=$VERSION" --locked --force; then
    echo "install-wasm-tools: --locked failed, resolving the CLI's dependencies afresh"
    cargo install wasm-bindgen-cli --version "=$VERSION" --force
  fi
fi
