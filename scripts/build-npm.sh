#!/usr/bin/env bash
# Builds the npm package `distopt` from the bindings crate crates/distopt-js:
#   1. cargo build -p distopt-js --target wasm32-unknown-unknown --profile wasm-release (size-optimized)
#   2. wasm-bindgen --target web (the CLI pinned to the crate's wasm-bindgen version)
#   3. the package template npm/ (package.json, index.js, index.d.ts, README.md)
#   4. npm pack
# Output: target/npm/package/ (the unpacked package) and target/npm/distopt-<version>.tgz.
#   (2b. wasm-opt -Oz, by default: binaryen 132 from npm, the copy tests/js installs from its
#        lockfile, else fetched by npx; Debian's binaryen 108 breaks the module, so not that one.
#        --no-wasm-opt skips it.)
# The sizes before and after wasm-opt are printed.
#
# Installs what a fresh machine lacks: the wasm32 rustup target and wasm-bindgen-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

WASM_OPT=1
for arg in "$@"; do
  case "$arg" in
    --wasm-opt) WASM_OPT=1 ;;
    --no-wasm-opt) WASM_OPT=0 ;;
    *) echo "usage: scripts/build-npm.sh [--no-wasm-opt]" >&2; exit 2 ;;
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

size_line() {
  echo "$(stat -c %s "$1") bytes raw, $(gzip -9 -c "$1" | wc -c) bytes gzipped (-9)"
}
if [ "$WASM_OPT" = 1 ]; then
  BINARYEN_VERSION=132.0.0
  WASM_OPT_BIN="$ROOT/tests/js/node_modules/binaryen/bin/wasm-opt"
  if [ -x "$WASM_OPT_BIN" ] && [ "$(node -p 'require(process.argv[1]).version' "$ROOT/tests/js/node_modules/binaryen/package.json")" = "$BINARYEN_VERSION" ]; then
    WASM_OPT_CMD=("$WASM_OPT_BIN")
  else
    WASM_OPT_CMD=(npx --yes "--package=binaryen@$BINARYEN_VERSION" -- wasm-opt)
  fi
  echo "build-npm: before wasm-opt: $(size_line "$PKG/wasm/distopt_wasm_bg.wasm")"
  echo "build-npm: wasm-opt -Oz (binaryen $BINARYEN_VERSION from npm)"
  "${WASM_OPT_CMD[@]}" -Oz --enable-bulk-memory --enable-nontrapping-float-to-int \
    --enable-sign-ext --enable-mutable-globals --enable-reference-types --enable-multivalue \
    "$PKG/wasm/distopt_wasm_bg.wasm" -o "$PKG/wasm/distopt_wasm_bg.wasm"
fi

cp npm/package.json npm/index.js npm/index.cjs npm/index.d.ts npm/README.md LICENSE-MIT LICENSE-APACHE "$PKG/"
# The package version follows the crate's.
CRATE_VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
node -e '
  const fs = require("fs");
  const path = process.argv[1];
  const pkg = JSON.parse(fs.readFileSync(path, "utf8"));
  pkg.version = process.argv[2];
  fs.writeFileSync(path, JSON.stringify(pkg, null, 2) + "\n");
' "$PKG/package.json" "$CRATE_VERSION"

(cd "$OUT" && rm -f distopt-*.tgz && npm pack ./package --silent >/dev/null)
TARBALL="$(ls "$OUT"/distopt-*.tgz)"
echo "build-npm: distopt_wasm_bg.wasm: $(size_line "$PKG/wasm/distopt_wasm_bg.wasm")"
echo "build-npm: package $TARBALL ($(stat -c %s "$TARBALL") bytes)"
