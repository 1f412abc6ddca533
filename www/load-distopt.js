// Which build of the npm package a page (or worker) uses: the threaded one, `distopt/threads`,
// whose CPU fallback runs on every core, where the page is cross-origin isolated (served with
// COOP/COEP, as scripts/serve.mjs does) and the package has it; else the plain one, on one
// thread. `?threads=0` in the page's address forces the plain build.

/** Imports the package found at `pkgUrl` (a URL ending in '/'), picking the build as above. */
export async function loadDistopt(pkgUrl) {
  const query = new URLSearchParams(globalThis.location?.search ?? '');
  if (globalThis.crossOriginIsolated === true && query.get('threads') !== '0') {
    try {
      return await import(new URL('threads/index.js', pkgUrl).href);
    } catch (error) {
      console.warn(`distopt/threads did not load (${error.message}); using the one-thread build`);
    }
  }
  return import(new URL('index.js', pkgUrl).href);
}
