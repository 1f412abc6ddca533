// Number formatting shared by the demo's page and charts.

/** 1234567 -> "1.23 MB" (decimal units, as network traffic is counted). */
export function formatBytes(bytes) {
  if (!Number.isFinite(bytes)) return '–';
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let u = 0;
  while (Math.abs(bytes) >= 1000 && u < units.length - 1) {
    bytes /= 1000;
    u++;
  }
  return `${bytes >= 100 || u === 0 ? Math.round(bytes) : bytes.toPrecision(3)} ${units[u]}`;
}
