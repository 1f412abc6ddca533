'use strict';
// distopt from CommonJS: `const { default: init, SGD } = require('distopt')`.
//
// The package is ES modules (so is the wasm-bindgen glue it wraps). Node 20.19+ and 22.12+
// load an ES module from require(); there this file hands back the ES module's namespace
// (`default` and `init` are init()). An older Node cannot, and gets an error that says what to
// do instead: `const distopt = await import('distopt')`.
try {
  module.exports = require('./index.js');
} catch (error) {
  if (error && (error.code === 'ERR_REQUIRE_ESM' || error.code === 'ERR_REQUIRE_ASYNC_MODULE')) {
    const hint = new Error(
      `distopt is an ES module package and this Node (${process.version}) cannot require() ES modules: ` +
        "load it with `const distopt = await import('distopt')` (or `import init from 'distopt'` in an ES module), " +
        'or use Node 20.19+ / 22.12+, whose require() loads it',
    );
    hint.code = 'ERR_REQUIRE_ESM';
    hint.cause = error;
    throw hint;
  }
  throw error;
}
