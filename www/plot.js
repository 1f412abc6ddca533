// A small line-chart renderer on <canvas> (no dependencies): crisp on high-DPI screens, axes
// with round ticks, several series, vertical event marks, and faint "ghost" series.

const DPR = () => Math.max(1, Math.min(3, globalThis.devicePixelRatio || 1));

/** Round tick values covering [lo, hi] (about `count` of them). */
export function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw) || raw;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  return ticks;
}

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

function formatTick(v, format) {
  if (format) return format(v);
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a >= 1e4 || a < 1e-3) return v.toExponential(0);
  return String(+v.toPrecision(3));
}

export class LineChart {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {{yFormat?: (v:number)=>string, yMin?: number, logY?: boolean, xLabel?: string}} options
   */
  constructor(canvas, options = {}) {
    this.canvas = canvas;
    this.options = options;
    this.series = [];
    this.ghosts = [];
    this.marks = [];
    this.xMax = 1;
    this.resize();
  }

  resize() {
    const rect = this.canvas.getBoundingClientRect();
    const dpr = DPR();
    this.width = Math.max(200, rect.width);
    this.height = Math.max(120, rect.height);
    this.canvas.width = Math.round(this.width * dpr);
    this.canvas.height = Math.round(this.height * dpr);
    this.ctx = this.canvas.getContext('2d');
    this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }

  /**
   * series: [{values: number[], color, width?, alpha?, label?}]; ghosts: [{values, color, label?}].
   * A label is written at the end of its line.
   */
  draw({ series = [], ghosts = [], marks = [], xMax = 1 }) {
    const { ctx, width: W, height: H, options } = this;
    const style = getComputedStyle(this.canvas);
    const ink = style.getPropertyValue('--ink').trim() || '#ccd';
    const grid = style.getPropertyValue('--grid').trim() || 'rgba(255,255,255,0.07)';
    const markColor = style.getPropertyValue('--mark').trim() || 'rgba(255,200,80,0.35)';
    ctx.clearRect(0, 0, W, H);
    const pad = { left: 54, right: 12, top: 10, bottom: 24 };
    const pw = W - pad.left - pad.right;
    const ph = H - pad.top - pad.bottom;

    const all = [...series, ...ghosts].flatMap((s) => s.values).filter(Number.isFinite);
    const log = options.logY;
    const tr = (v) => (log ? Math.log10(Math.max(v, 1e-12)) : v);
    let lo = options.yMin !== undefined ? options.yMin : all.length ? Math.min(...all.map(tr)) : 0;
    let hi = all.length ? Math.max(...all.map(tr)) : 1;
    if (log) lo = all.length ? Math.min(...all.map(tr)) : 0;
    if (!(hi > lo)) hi = lo + (log ? 1 : Math.abs(lo) || 1);
    const span = hi - lo;
    if (options.yMin === undefined || log) lo -= span * 0.04;
    hi += span * 0.06;
    const xm = Math.max(xMax, 2);
    const X = (i) => pad.left + (i / (xm - 1)) * pw;
    const Y = (v) => pad.top + ph - ((tr(v) - lo) / (hi - lo)) * ph;

    // Grid and y ticks.
    ctx.font = '11px ui-sans-serif, system-ui, sans-serif';
    ctx.fillStyle = ink;
    ctx.strokeStyle = grid;
    ctx.lineWidth = 1;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    const yticks = log
      ? niceTicks(lo, hi, 4).filter((t) => Number.isInteger(t) || Math.abs(t - Math.round(t)) < 1e-9)
      : niceTicks(lo, hi, 4);
    for (const t of yticks) {
      const y = pad.top + ph - ((t - lo) / (hi - lo)) * ph;
      if (y < pad.top - 1 || y > pad.top + ph + 1) continue;
      ctx.beginPath();
      ctx.moveTo(pad.left, Math.round(y) + 0.5);
      ctx.lineTo(pad.left + pw, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillText(formatTick(log ? 10 ** t : t, options.yFormat), pad.left - 6, y);
    }
    // x ticks (steps).
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    for (const t of niceTicks(0, xm - 1, 6)) {
      if (!Number.isInteger(t)) continue;
      ctx.fillText(String(t), X(t), pad.top + ph + 6);
    }

    // Event marks (averaging steps): thin vertical lines.
    ctx.strokeStyle = markColor;
    ctx.beginPath();
    for (const i of marks) {
      const x = Math.round(X(i)) + 0.5;
      ctx.moveTo(x, pad.top);
      ctx.lineTo(x, pad.top + ph);
    }
    ctx.stroke();

    const line = (values, color, width, alpha, dash) => {
      ctx.save();
      ctx.globalAlpha = alpha;
      ctx.strokeStyle = color;
      ctx.lineWidth = width;
      ctx.lineJoin = 'round';
      if (dash) ctx.setLineDash(dash);
      ctx.beginPath();
      let started = false;
      // Long runs: draw at most ~2 points per pixel.
      const stride = Math.max(1, Math.floor(values.length / (pw * 2)));
      for (let i = 0; i < values.length; i += stride) {
        const v = values[i];
        if (!Number.isFinite(v)) {
          started = false;
          continue;
        }
        if (started) ctx.lineTo(X(i), Y(v));
        else ctx.moveTo(X(i), Y(v));
        started = true;
      }
      ctx.stroke();
      ctx.restore();
    };
    for (const g of ghosts) line(g.values, g.color, 1.5, 0.55, [5, 4]);
    for (const s of series) line(s.values, s.color, s.width || 1.5, s.alpha ?? 1, null);

    // End labels: at each labelled line's last point, nudged apart vertically.
    ctx.save();
    ctx.font = '600 11px ui-sans-serif, system-ui, sans-serif';
    ctx.textBaseline = 'bottom';
    const taken = [];
    for (const s of [...series, ...ghosts]) {
      if (!s.label) continue;
      let i = s.values.length - 1;
      while (i >= 0 && !Number.isFinite(s.values[i])) i--;
      if (i < 0) continue;
      const x = X(i);
      let y = Math.max(pad.top + 12, Y(s.values[i]) - 3);
      while (taken.some((t) => Math.abs(t.y - y) < 12 && Math.abs(t.x - x) < 90)) y -= 12;
      if (y < pad.top + 12) y = Math.max(pad.top + 12, Y(s.values[i]) + 15);
      taken.push({ x, y });
      ctx.textAlign = x > pad.left + pw - 90 ? 'right' : 'left';
      const tx = ctx.textAlign === 'right' ? x - 2 : x + 4;
      // A halo of the plot's background keeps the label legible over the lines.
      ctx.lineWidth = 3;
      ctx.lineJoin = 'round';
      ctx.strokeStyle = 'rgba(21, 27, 36, 0.85)';
      ctx.strokeText(s.label, tx, y);
      ctx.fillStyle = s.color;
      ctx.fillText(s.label, tx, y);
    }
    ctx.restore();

    // Frame.
    ctx.strokeStyle = grid;
    ctx.strokeRect(pad.left + 0.5, pad.top + 0.5, pw, ph);
  }
}
