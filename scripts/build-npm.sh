#!/usr/bin/env bash
# Builds the npm package `distopt` from the bindings crate crates/distopt-js:
#   1. cargo build -p distopt-js --target wasm32-unknown-unknown --profile wasm-release (size-optimized)
#   2. wasm-bindgen --target web (the CLI pinned to the crate's wasm-bindgen version)
#   3. the package template npm/ (package.json, index.js, index.d.ts, README.md)
#   4. npm pack
# Output: target/npm/package/ (the unpacked package) and target/npm/distopt-<version>.tgz.
# wasm-opt is skipped by default (Debian's binaryen 108 breaks the module); --wasm-opt runs
# wasm-opt -Oz from npm's binaryen (fetched by npx, ~100 MB): about 36% smaller raw, 21% gzipped.
#
# Installs what a fresh machine lacks: the wasm32 rustup target and wasm-bindgen-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

WASM_OPT=0
for arg in "$@"; do
  case "$arg" in
    --wasm-opt) WASM_OPT=1 ;;
    *) echo "usage: scripts/build-npm.sh [--wasm-opt]" >&2; exit 2 ;;
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

if [ "$WASM_OPT" = 1 ]; then
  echo "build-npm: wasm-opt -Oz (npm binaryen)"
  npx --yes --package=binaryen@132.0.0 -- wasm-opt -Oz --enable-bulk-memory --enable-nontrapping-float-to-int \
    --enable-sign-ext --enable-mutable-globals --enable-reference-types --enable-multivalue \
    "$PKG/wasm/distopt_wasm_bg.wasm" -o "$PKG/wasm/distopt_wasm_bg.wasm"
fi

cp npm/package.json npm/index.js npm/index.d.ts npm/README.md "$PKG/"
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
RAW=$(stat -c %s "$PKG/wasm/distopt_wasm_bg.wasm")
GZ=$(gzip -9 -c "$PKG/wasm/distopt_wasm_bg.wasm" | wc -c)
echo "build-npm: distopt_wasm_bg.wasm: $RAW bytes raw, $GZ bytes gzipped (-9)"
echo "build-npm: package $TARBALL"
