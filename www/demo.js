// The distopt demo: R simulated ranks train a small perceptron with synchronous SGD,
// post-local SGD (periodic or hierarchical model averaging), ZeRO or DiLoCo, step by step, through the npm
// package's `Trainer`; the plots show each rank's loss, how far the replicas drift apart and
// what the collectives would have sent.

import init, { Trainer, selectBackend, version } from './pkg/index.js';
import { LineChart, formatBytes } from './plot.js';

const $ = (id) => document.getElementById(id);
const MAX_STEPS = 1500;
const FRAME_BUDGET_MS = 24;
const EVALUATE_EVERY = 25;
const SMOOTHING = 0.12;

const demo = {
  ready: false,
  history: [],
  framesDrawn: 0,
  info: null,
  ghosts: [],
};
window.demo = demo;

const ui = {
  algorithm: $('algorithm'),
  ranks: $('ranks'),
  period: $('period'),
  warmup: $('warmup'),
  fragments: $('fragments'),
  lr: $('lr'),
  skew: $('skew'),
  backend: $('backend'),
  start: $('start'),
  reset: $('reset'),
};

const charts = {
  loss: new LineChart($('loss-chart')),
  divergence: new LineChart($('divergence-chart'), { yMin: 0 }),
  bytes: new LineChart($('bytes-chart'), { yMin: 0, yFormat: formatBytes }),
};

const GHOST_COLORS = ['#c3cad6', '#8f9aab', '#66707f'];
const CLASS_COLORS = ['#7aa2ff', '#5ee6c8', '#f5b454', '#ff7eb6', '#b18cff', '#9be15d'];
let trainer = null;
let run = null;
let ghosts = [];
let running = false;

function rankColor(rank, ranks) {
  return `hsl(${(205 + (rank * 360) / ranks) % 360} 78% 66%)`;
}

/** DiLoCo's fragments, at most the period (every fragment syncs once a period). */
function fragments() {
  return Math.min(Number(ui.fragments.value), Number(ui.period.value));
}

function settings() {
  const s = {
    ranks: Number(ui.ranks.value),
    algorithm: ui.algorithm.value,
    period: Number(ui.period.value),
    warmup: Number(ui.warmup.value),
    lr: Number(ui.lr.value),
    task: { heterogeneity: Number(ui.skew.value) },
  };
  if (s.algorithm === 'diloco') s.fragments = fragments();
  return s;
}

function shortName(s) {
  if (s.algorithm === 'sync') return `sync SGD · R=${s.ranks}`;
  if (s.algorithm === 'zero') return `ZeRO · R=${s.ranks}`;
  if (s.algorithm === 'diloco') {
    return `${s.fragments > 1 ? 'streaming ' : ''}DiLoCo · R=${s.ranks} · H=${s.period}${s.fragments > 1 ? ` · F=${s.fragments}` : ''}`;
  }
  return `${s.algorithm} · R=${s.ranks} · P=${s.period}`;
}

function describeHierarchy(levels, ranks) {
  return levels
    .map(([period, size], i) => {
      const where = size === ranks ? `over all ${ranks} ranks` : `within groups of ${size}`;
      return `${i === 0 ? 'every' : 'every'} <b>${period}</b> step${period === 1 ? '' : 's'} ${where}`;
    })
    .join(', ');
}

function updateHelp() {
  const s = settings();
  for (const field of document.querySelectorAll('[data-for]')) {
    field.classList.toggle('disabled', !field.dataset.for.split(' ').includes(s.algorithm));
  }
  let text;
  if (s.algorithm === 'sync') {
    text = `Every step the ranks <b>all-reduce their gradients</b> (the DDP hook), so all ${s.ranks} replicas stay identical: divergence stays 0 and every step costs a full ring all-reduce.`;
  } else if (s.algorithm === 'zero') {
    text = `Synchronous SGD (gradients <b>all-reduced</b> every step, replicas identical) with a <code>ZeroRedundancyOptimizer</code>: each rank keeps the <b>momentum of only the parameters it owns</b> (whole parameters, assigned largest first to the least-loaded rank, so with fewer parameters than ranks some own none), updates them, and <b>broadcasts</b> them to the other ranks, so it sends more than plain synchronous SGD.`;
  } else if (s.algorithm === 'diloco') {
    const streaming =
      s.fragments > 1
        ? ` <b>Streaming</b>: the model is split into <b>${s.fragments} fragments</b> that sync on a staggered schedule, so each sync sends only a fragment.`
        : '';
    text = `Each rank takes <b>${s.period} local SGD steps</b> on its own shard with no gradient all-reduce; then the ranks all-reduce their <b>pseudo-gradients</b> (how far each moved from the last synced model) and an <b>outer SGD</b> (lr 0.7, Nesterov momentum 0.9) applies the mean, leaving every replica on the same model.${streaming}`;
  } else if (s.algorithm === 'periodic') {
    text = `<b>${s.warmup}</b> warm-up steps of synchronous SGD, then each rank steps on its own shard and the models are <b>averaged over all ranks every ${s.period} steps</b> (<code>PeriodicModelAverager</code>).`;
  } else {
    const levels = Trainer.defaultHierarchy(s.period, s.ranks);
    text = `<b>${s.warmup}</b> warm-up steps of synchronous SGD, then local steps; models averaged ${describeHierarchy(levels, s.ranks)} (<code>HierarchicalModelAverager</code>, the largest matching period wins).`;
  }
  $('algorithm-help').innerHTML = text;
  $('ranks-lede').textContent = String(s.ranks);
}

function updateOutputs() {
  $('ranks-value').textContent = ui.ranks.value;
  $('period-value').textContent = ui.period.value;
  $('warmup-value').textContent = ui.warmup.value;
  $('fragments-value').textContent = String(fragments());
  $('lr-value').textContent = Number(ui.lr.value).toFixed(2);
  $('skew-value').textContent = Number(ui.skew.value).toFixed(2);
}

function renderShards() {
  const box = $('shards');
  box.textContent = '';
  const ranks = trainer.ranks;
  const classColors = CLASS_COLORS;
  for (let r = 0; r < ranks; r++) {
    const counts = trainer.classCounts(r);
    const total = counts.reduce((a, b) => a + b, 0) || 1;
    const row = document.createElement('div');
    row.className = 'shard';
    const label = document.createElement('span');
    label.innerHTML = `<span class="chip" style="background:${rankColor(r, ranks)}"></span>${r}`;
    const bar = document.createElement('div');
    bar.className = 'bar';
    bar.title = `rank ${r}: ${counts.map((c, k) => `class ${k}: ${c}`).join(', ')}`;
    counts.forEach((c, k) => {
      const seg = document.createElement('span');
      seg.style.width = `${(100 * c) / total}%`;
      seg.style.background = classColors[k % classColors.length];
      bar.appendChild(seg);
    });
    row.append(label, bar);
    box.appendChild(row);
  }
  const classes = trainer.classCounts(0).length;
  $('class-legend').innerHTML = Array.from(
    { length: classes },
    (_, k) => `<span class="chip" style="background:${classColors[k % classColors.length]}"></span>class ${k}`,
  ).join(' ');
  const legend = $('legend');
  legend.textContent = '';
  for (let r = 0; r < ranks; r++) {
    const item = document.createElement('span');
    item.innerHTML = `<span class="chip" style="background:${rankColor(r, ranks)}"></span>r${r}`;
    legend.appendChild(item);
  }
}

function newRun() {
  if (run && run.history.length >= 10) {
    ghosts.unshift({
      label: run.label,
      name: run.name,
      loss: run.meanLoss,
      bytes: run.bytes,
      divergence: run.divergence,
      accuracy: run.accuracyAt,
    });
    ghosts = ghosts.slice(0, GHOST_COLORS.length);
    demo.ghosts = ghosts;
  }
  if (trainer) trainer.free();
  const s = settings();
  trainer = new Trainer(s);
  run = {
    label: shortName(s),
    name: shortName(s).split(' · ')[0],
    description: trainer.description,
    history: [],
    lossPerRank: Array.from({ length: s.ranks }, () => []),
    meanLoss: [],
    divergence: [],
    bytes: [],
    marks: [],
    accuracy: null,
    accuracyAt: [],
    stepTimes: [],
  };
  demo.history = run.history;
  renderShards();
  updateHelp();
  updateStats();
  $('footer-run').textContent = run.description;
  draw();
}

function smoothed(series, value) {
  const last = series.length ? series[series.length - 1] : value;
  return series.length ? last + SMOOTHING * (value - last) : value;
}

function record(report) {
  run.history.push(report);
  report.lossPerRank.forEach((loss, r) => run.lossPerRank[r].push(smoothed(run.lossPerRank[r], loss)));
  run.meanLoss.push(smoothed(run.meanLoss, report.meanLoss));
  run.divergence.push(report.divergence);
  run.bytes.push(report.bytesCommunicatedPerRank);
  if (report.averaged !== null) run.marks.push(run.history.length - 1);
  run.stepTimes.push(performance.now());
  if (run.stepTimes.length > 120) run.stepTimes.shift();
}

/** Optimizer state per rank: one size, or the range over the ranks (ZeRO's shards differ). */
function formatStateBytes(perRank) {
  if (!perRank.length || perRank.every((b) => b === 0)) return '–';
  const lo = Math.min(...perRank);
  const hi = Math.max(...perRank);
  return lo === hi ? formatBytes(hi) : `${formatBytes(lo)}–${formatBytes(hi)}`;
}

function updateStats() {
  const h = run.history;
  const last = h[h.length - 1];
  $('stat-step').textContent = String(h.length);
  $('stat-loss').textContent = last ? run.meanLoss[run.meanLoss.length - 1].toFixed(3) : '–';
  $('stat-divergence').textContent = last ? last.divergence.toFixed(3) : '–';
  $('stat-bytes').textContent = last ? formatBytes(last.bytesCommunicatedPerRank) : '–';
  $('stat-state').textContent = formatStateBytes(last ? last.optimizerStateBytesPerRank : trainer.optimizerStateBytesPerRank());
  $('stat-accuracy').textContent = run.accuracy === null ? '–' : `${(100 * run.accuracy).toFixed(1)}%`;
  const t = run.stepTimes;
  const speed = t.length > 1 ? ((t.length - 1) * 1000) / (t[t.length - 1] - t[0]) : NaN;
  $('stat-speed').textContent = Number.isFinite(speed) && running ? speed.toFixed(speed < 10 ? 1 : 0) : '–';
}

/** The runs table: every run's numbers at the current run's step (or its last). */
function renderRuns() {
  const body = $('runs');
  const at = Math.max(run.history.length - 1, 0);
  const row = (label, loss, accuracy, divergence, bytes, steps, color, cls) => {
    const i = Math.min(at, steps - 1);
    const perStep = i >= 0 ? bytes[i] / (i + 1) : NaN;
    const cell = (v, f) => (i >= 0 && Number.isFinite(v) ? f(v) : '–');
    // The last evaluation at or before step i + 1.
    const evaluated = accuracy.filter(([step]) => step <= i + 1).at(-1);
    return `<tr class="${cls}"><td><span class="swatch" style="border-color:${color}"></span>${label}</td>
      <td>${Math.max(0, Math.min(at + 1, steps))}</td>
      <td>${cell(loss[i], (v) => v.toFixed(3))}</td>
      <td>${evaluated ? `${(100 * evaluated[1]).toFixed(1)}%` : '–'}</td>
      <td>${cell(divergence[i], (v) => v.toFixed(3))}</td>
      <td>${cell(bytes[i], formatBytes)}</td>
      <td>${cell(perStep, formatBytes)}</td></tr>`;
  };
  body.innerHTML = [
    row(run.label, run.meanLoss, run.accuracyAt, run.divergence, run.bytes, run.history.length, '#f3f6fa', 'current'),
    ...ghosts.map((g, k) =>
      row(g.label, g.loss, g.accuracy, g.divergence, g.bytes, g.loss.length, GHOST_COLORS[k], 'ghost'),
    ),
  ].join('');
}

function draw() {
  renderRuns();
  const ranks = run.lossPerRank.length;
  const xMax = Math.max(run.history.length, ...ghosts.map((g) => g.loss.length), 50);
  charts.loss.draw({
    xMax,
    series: [
      ...run.lossPerRank.map((values, r) => ({ values, color: rankColor(r, ranks), width: 1.2, alpha: 0.75 })),
      { values: run.meanLoss, color: '#f3f6fa', width: 2.4, label: run.name },
    ],
    ghosts: ghosts.map((g, i) => ({ values: g.loss, color: GHOST_COLORS[i], label: g.name })),
  });
  charts.divergence.draw({
    xMax,
    series: [{ values: run.divergence, color: '#5ee6c8', width: 1.8 }],
    marks: run.marks,
  });
  charts.bytes.draw({
    xMax,
    series: [{ values: run.bytes, color: '#7aa2ff', width: 2, label: run.name }],
    ghosts: ghosts.map((g, i) => ({ values: g.bytes, color: GHOST_COLORS[i], label: g.name })),
  });
  demo.framesDrawn++;
}

function nextFrame() {
  return new Promise((resolve) => {
    if (document.hidden) setTimeout(resolve, 0);
    else requestAnimationFrame(() => resolve());
  });
}

async function loop(token) {
  try {
    while (running && token === run) {
      const frameStart = performance.now();
      do {
        const report = await trainer.step();
        if (token !== run) return;
        record(report);
      } while (running && performance.now() - frameStart < FRAME_BUDGET_MS && run.history.length < MAX_STEPS);
      if (run.history.length % EVALUATE_EVERY < 4 || run.history.length >= MAX_STEPS) {
        const evaluation = await trainer.evaluate();
        if (token !== run) return;
        run.accuracy = evaluation.meanModelAccuracy;
        run.accuracyAt.push([run.history.length, evaluation.meanModelAccuracy]);
      }
      updateStats();
      draw();
      if (run.history.length >= MAX_STEPS) setRunning(false);
      await nextFrame();
    }
  } catch (error) {
    setRunning(false);
    showError(error);
  }
}

function setRunning(on) {
  running = on;
  ui.start.textContent = on ? 'Pause' : run && run.history.length ? 'Resume' : 'Start';
  if (on) loop(run);
  else if (run) updateStats();
}

function showError(error) {
  const box = $('adapter');
  box.className = 'adapter error';
  box.querySelector('.text').innerHTML = `<b>${error.name || 'Error'}</b>: ${error.message}`;
  console.error(error);
}

function showAdapter(info, choice) {
  const box = $('adapter');
  box.dataset.kind = info.kind;
  box.className = `adapter ${info.kind}`;
  const text = box.querySelector('.text');
  const a = info.adapterInfo;
  const detail = a ? [a.vendor, a.architecture].filter(Boolean).join(' · ') : '';
  if (info.kind === 'gpu') {
    text.innerHTML = `<b>WebGPU</b> · ${info.name}<span class="sub">${detail}${a && a.isFallbackAdapter ? ' · software (fallback) adapter' : ''}</span>`;
  } else if (choice === 'cpu') {
    text.innerHTML = `<b>CPU backend</b> · as selected<span class="sub">distopt's plain-Rust backend, compiled to WebAssembly, on one thread</span>`;
  } else if (a) {
    text.innerHTML = `<b>CPU backend</b> · faster than this browser's software WebGPU adapter<span class="sub">WebGPU offers only ${a.description || detail || 'a software adapter'}${a.description && detail ? ` (${detail})` : ''}; pick “WebGPU” under Backend to use it anyway</span>`;
  } else {
    text.innerHTML = `<b>CPU fallback</b> · WebGPU is not available in this browser<span class="sub">distopt's plain-Rust backend, compiled to WebAssembly, on one thread</span>`;
  }
  box.title = info.reason;
}

async function changeBackend() {
  const choice = ui.backend.value;
  const wasRunning = running;
  running = false;
  try {
    const info = await selectBackend(choice);
    info.adapterInfo = demo.info && demo.info.adapterInfo;
    demo.info = info;
    showAdapter(info, choice);
    demo.backend = choice;
  } catch (error) {
    ui.backend.value = demo.backend;
    showError(error);
    setTimeout(() => showAdapter(demo.info, demo.backend), 4000);
  }
  restart(wasRunning);
}

async function main() {
  updateOutputs();
  const backend = new URLSearchParams(location.search).get('backend') || 'auto';
  let info;
  try {
    info = await init({ backend });
  } catch (error) {
    showError(error);
    return;
  }
  demo.info = info;
  demo.backend = backend;
  ui.backend.value = backend;
  showAdapter(info, backend);
  $('version').textContent = version();
  newRun();
  for (const input of [ui.ranks, ui.period, ui.warmup, ui.fragments, ui.lr, ui.skew]) {
    input.addEventListener('input', () => {
      updateOutputs();
      updateHelp();
    });
    input.addEventListener('change', () => restart());
  }
  ui.algorithm.addEventListener('change', () => restart());
  ui.backend.addEventListener('change', () => changeBackend());
  ui.start.addEventListener('click', () => setRunning(!running));
  ui.reset.addEventListener('click', () => restart());
  ui.start.disabled = false;
  ui.reset.disabled = false;
  let resizeTimer;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      Object.values(charts).forEach((c) => c.resize());
      draw();
    }, 100);
  });
  demo.ready = true;
}

function restart(wasRunning = running) {
  running = false;
  try {
    newRun();
  } catch (error) {
    showError(error);
    return;
  }
  setRunning(wasRunning);
}

main();
