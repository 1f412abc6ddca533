#!/usr/bin/env bash
# Builds the npm package `distopt` from the bindings crate crates/distopt-js:
#   1. cargo build -p distopt-js --target wasm32-unknown-unknown --profile wasm-release (size-optimized)
#   2. wasm-bindgen --target web (the CLI pinned to the crate's wasm-bindgen version)
#   3. the package template npm/ (package.json, index.js, README.md), and index.d.ts generated
#      from wasm-bindgen's declarations and npm/supplement.d.ts (scripts/typings.mjs)
#   4. npm pack
# Output: target/npm/package/ (the unpacked package) and target/npm/distopt-<version>.tgz.
#   (2b. wasm-opt -Oz, by default: binaryen 132 from npm, the copy tests/js installs from its
#        lockfile, else fetched by npx; Debian's binaryen 108 breaks the module, so not that one.
#        --no-wasm-opt skips it.)
# The sizes before and after wasm-opt are printed.
#   (5. the threaded build, `distopt/threads`, where a nightly toolchain with rust-src exists:
#       the same crate with WebAssembly atomics and shared memory, std rebuilt for them
#       (-Z build-std), into wasm-threads/; threads/ holds index.js as it is beside
#       npm/threads/flavor.js (which imports that glue) and worker.js, the worker that serves
#       the CPU fallback's pool. Without nightly the
#       package has no `distopt/threads` and says so. --no-threads skips it.)
#
# Installs what a fresh machine lacks: the wasm32 rustup target and wasm-bindgen-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

WASM_OPT=1
THREADS=1
for arg in "$@"; do
  case "$arg" in
    --wasm-opt) WASM_OPT=1 ;;
    --no-wasm-opt) WASM_OPT=0 ;;
    --no-threads) THREADS=0 ;;
    *) echo "usage: scripts/build-npm.sh [--no-wasm-opt] [--no-threads]" >&2; exit 2 ;;
  esac
done

# The wasm-bindgen version the bindings crate pins (=x.y.z): the CLI must be exactly that one.
WB_VERSION="$(sed -n 's/^wasm-bindgen = "=\([0-9.]*\)".*/\1/p' crates/distopt-js/Cargo.toml | head -1)"
if [ -z "$WB_VERSION" ]; then
  echo "build-npm: crates/distopt-js/Cargo.toml does not pin wasm-bindgen (=x.y.z)" >&2
  exit 1
fi
scripts/install-wasm-tools.sh "$WB_VERSION"
export PATH="$HOME/.cargo/bin:$PATH"

echo "build-npm: cargo build (wasm32, profile wasm-release)"
cargo build -p distopt-js --lib --locked --target wasm32-unknown-unknown --profile wasm-release
WASM="${CARGO_TARGET_DIR:-target}/wasm32-unknown-unknown/wasm-release/distopt_js.wasm"

OUT="$ROOT/target/npm"
PKG="$OUT/package"
rm -rf "$PKG"
mkdir -p "$PKG/wasm"
echo "build-npm: wasm-bindgen $WB_VERSION --target web"
wasm-bindgen --target web --no-typescript --out-dir "$PKG/wasm" --out-name distopt_wasm "$WASM"
# The glue's own declarations (the Rust bindings' rustdoc, argument and result types, and the
# records' tsify interfaces): the package's index.d.ts is generated from them and the
# hand-written npm/supplement.d.ts (scripts/typings.mjs).
rm -rf "$OUT/glue-types"
wasm-bindgen --target web --out-dir "$OUT/glue-types" --out-name distopt_wasm "$WASM"
rm -f "$OUT/glue-types"/*.js "$OUT/glue-types"/*.wasm
echo "build-npm: index.d.ts (generated: scripts/typings.mjs)"
node scripts/typings.mjs "$OUT/glue-types/distopt_wasm.d.ts" npm/supplement.d.ts "$PKG/index.d.ts"
# The parameter names index.js gives arguments in its messages, from those declarations.
node scripts/glue-params.mjs "$PKG/index.d.ts" "$PKG/wasm/params.js"

size_line() {
  echo "$(stat -c %s "$1") bytes raw, $(gzip -9 -c "$1" | wc -c) bytes gzipped (-9)"
}
BINARYEN_VERSION=132.0.0
if [ "$WASM_OPT" = 1 ]; then
  WASM_OPT_BIN="$ROOT/tests/js/node_modules/binaryen/bin/wasm-opt"
  if [ -x "$WASM_OPT_BIN" ] && [ "$(node -p 'require(process.argv[1]).version' "$ROOT/tests/js/node_modules/binaryen/package.json")" = "$BINARYEN_VERSION" ]; then
    WASM_OPT_CMD=("$WASM_OPT_BIN")
  else
    WASM_OPT_CMD=(npx --yes "--package=binaryen@$BINARYEN_VERSION" -- wasm-opt)
  fi
  # SIMD: the frames' BLAKE3 (blake3's wasm32_simd, 4 lanes of SIMD128).
  WASM_FEATURES=(--enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext
    --enable-mutable-globals --enable-reference-types --enable-multivalue --enable-simd)
  echo "build-npm: before wasm-opt: $(size_line "$PKG/wasm/distopt_wasm_bg.wasm")"
  echo "build-npm: wasm-opt -Oz (binaryen $BINARYEN_VERSION from npm)"
  "${WASM_OPT_CMD[@]}" -Oz "${WASM_FEATURES[@]}" \
    "$PKG/wasm/distopt_wasm_bg.wasm" -o "$PKG/wasm/distopt_wasm_bg.wasm"
fi

# 5. The threaded build (see the header): nightly's rust-src rebuilds std with atomics.
HAVE_THREADS=0
if [ "$THREADS" = 1 ]; then
  if cargo +nightly --version >/dev/null 2>&1 \
    && { rustup component list --toolchain nightly --installed 2>/dev/null | grep -qx rust-src \
      || rustup component add rust-src --toolchain nightly >/dev/null 2>&1; }; then
    HAVE_THREADS=1
  else
    echo "build-npm: no nightly toolchain with rust-src here: the package has no distopt/threads (the CPU fallback runs on one thread)"
  fi
fi
if [ "$HAVE_THREADS" = 1 ]; then
  echo "build-npm: cargo +nightly build (wasm32 with atomics and shared memory, -Z build-std)"
  THREADS_TARGET="${CARGO_TARGET_DIR:-target}/wasm-threads"
  # Shared memory up to 4 GiB; the linker exports what wasm-bindgen's thread start needs.
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+atomics,+bulk-memory,+mutable-globals \
-C link-arg=--shared-memory -C link-arg=--max-memory=4294967296 -C link-arg=--import-memory \
-C link-arg=--export=__wasm_init_tls -C link-arg=--export=__tls_size -C link-arg=--export=__tls_align \
-C link-arg=--export=__tls_base" \
    cargo +nightly build -p distopt-js --lib --locked --target wasm32-unknown-unknown \
    --profile wasm-release -Z build-std=panic_abort,std --target-dir "$THREADS_TARGET"
  mkdir -p "$PKG/wasm-threads" "$PKG/threads"
  wasm-bindgen --target web --no-typescript --out-dir "$PKG/wasm-threads" --out-name distopt_wasm \
    "$THREADS_TARGET/wasm32-unknown-unknown/wasm-release/distopt_js.wasm"
  if [ "$WASM_OPT" = 1 ]; then
    echo "build-npm: wasm-opt -Oz (threaded build)"
    "${WASM_OPT_CMD[@]}" -Oz "${WASM_FEATURES[@]}" --enable-threads \
      "$PKG/wasm-threads/distopt_wasm_bg.wasm" -o "$PKG/wasm-threads/distopt_wasm_bg.wasm"
  fi
  # The same parameter names (the threaded glue exports the same calls).
  cp "$PKG/wasm/params.js" "$PKG/wasm-threads/params.js"
  # The same guarded API (index.js, unchanged) over the threaded build's flavor.js.
  cp npm/index.js npm/threads/flavor.js npm/threads/worker.js "$PKG/threads/"
fi

cp npm/package.json npm/index.js npm/flavor.js npm/index.cjs npm/README.md LICENSE-MIT LICENSE-APACHE "$PKG/"
# The synchronous NATS port (a rank's link to a NATS run, distopt/nats) and the worker that
# runs nats.js, bundled by esbuild with nats.js (@nats-io/*, pinned in tests/js with esbuild)
# once for Node (TCP) and once for browsers (WebSocket): the package installs nothing else,
# and a page needs no bundler or import map to start the worker. nats.js is Apache-2.0: its
# notices are kept at the end of each file.
mkdir -p "$PKG/nats"
cp npm/nats/port.js npm/nats/port.d.ts "$PKG/nats/"
ESBUILD=tests/js/node_modules/.bin/esbuild
if [ ! -x "$ESBUILD" ]; then
  echo "build-npm: $ESBUILD is missing: run .ci/install-js (tests/js's dependencies) first" >&2
  exit 1
fi
for platform in node browser; do
  banner="// distopt's NATS worker ($platform): npm/nats/worker.js bundled with nats.js (@nats-io/*, Apache-2.0) by esbuild."
  # nats.js's CommonJS parts require Node's modules (crypto, net): an ES module has no
  # `require` of its own, so the Node bundle makes one.
  if [ "$platform" = node ]; then
    banner="$banner
import { createRequire as distoptRequire } from 'node:module'; const require = distoptRequire(import.meta.url);"
  fi
  NODE_PATH=tests/js/node_modules "$ESBUILD" "npm/nats/worker-$platform.js" --bundle --minify \
    --format=esm --platform="$platform" --legal-comments=eof --log-level=warning \
    --banner:js="$banner" --outfile="$PKG/nats/worker.$platform.js"
done
# distopt/worker: the package in a worker of its own, every call awaited (a page's main thread).
mkdir -p "$PKG/worker"
cp npm/worker/remote.js npm/worker/remote.d.ts npm/worker/host.js "$PKG/worker/"
# The package version follows the crate's.
CRATE_VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
node -e '
  const fs = require("fs");
  const path = process.argv[1];
  const pkg = JSON.parse(fs.readFileSync(path, "utf8"));
  pkg.version = process.argv[2];
  if (process.argv[3] !== "1") {
    delete pkg.exports["./threads"];
    pkg.files = pkg.files.filter((f) => !/^(threads|wasm-threads)\//.test(f));
  }
  fs.writeFileSync(path, JSON.stringify(pkg, null, 2) + "\n");
' "$PKG/package.json" "$CRATE_VERSION" "$HAVE_THREADS"

(cd "$OUT" && rm -f distopt-*.tgz && npm pack ./package --silent >/dev/null)
TARBALL="$(ls "$OUT"/distopt-*.tgz)"
echo "build-npm: distopt_wasm_bg.wasm: $(size_line "$PKG/wasm/distopt_wasm_bg.wasm")"
if [ "$HAVE_THREADS" = 1 ]; then
  echo "build-npm: threaded distopt_wasm_bg.wasm: $(size_line "$PKG/wasm-threads/distopt_wasm_bg.wasm")"
fi
echo "build-npm: package $TARBALL ($(stat -c %s "$TARBALL") bytes)"
