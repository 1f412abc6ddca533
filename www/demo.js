// The distopt demo: R simulated ranks train a small perceptron — on a synthetic task or on the
// UCI hand-written digits, split non-IID over the ranks — with synchronous SGD, post-local SGD
// (periodic or hierarchical model averaging), ZeRO or DiLoCo, step by step, through the npm
// package's `Trainer`. The training loop runs in a Web Worker (worker.js); this page only
// draws: uPlot charts of each rank's loss, the held-out accuracy, how far the replicas drift
// apart and what the collectives would have sent.
//
// Across tabs and devices: where the page's server runs a NATS server (scripts/demo.sh says so
// in /config/nats.json), "Invite" makes a run that other tabs join by its link
// (`?run=NAME&s=SETTINGS`): each tab is then one rank, its worker joined to the run over the
// server's WebSocket listener (distopt/nats), and every tab plots every rank.

import qrcode from './vendor/qrcode/qrcode.mjs';
import uPlot from './vendor/uplot/uPlot.esm.js';
import { formatBytes } from './format.js';
import { lastWord } from './leave.js';

const $ = (id) => document.getElementById(id);
const SMOOTHING = 0.12;

const demo = {
  ready: false,
  history: [],
  evaluations: [],
  framesDrawn: 0,
  info: null,
  ghosts: [],
  worker: null,
  /** Messages the worker has posted (the browser test checks the loop runs there). */
  messages: 0,
};
window.demo = demo;

const ui = {
  task: $('task'),
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

const GHOST_COLORS = ['#c3cad6', '#8f9aab', '#66707f'];
/** Ghost runs are told apart by dash as well as shade. */
const GHOST_DASH = [[10, 4], [4, 4], [1, 4]];
/** Ranks are told apart by dash pattern as well as hue. */
const RANK_DASH = [[], [8, 4], [2, 3], [10, 3, 2, 3], [4, 4], [12, 6], [2, 6], [6, 2, 2, 2]];
const CLASS_COLORS = ['#7aa2ff', '#5ee6c8', '#f5b454', '#ff7eb6', '#b18cff', '#9be15d', '#ff9f6e', '#6ee0ff', '#e0e36e', '#d98cff'];

/** The run this tab is a rank of, from its link (`?run=NAME&s=SETTINGS`); null when simulated. */
const networked = invitation(new URLSearchParams(location.search));
/** Steps a run trains: the page's `?steps=N` (a networked run: its invitation's), else 1500. */
const runSteps = networked ? networked.steps : stepsOf(new URLSearchParams(location.search).get('steps'));
// A networked rank blocks its worker's thread on the port: the one-thread build.
const worker = new Worker(new URL(networked ? './worker.js?threads=0' : './worker.js', import.meta.url), {
  type: 'module',
});
demo.worker = worker;
let run = null;
/** The page's own connection that says this rank leaves (a networked run, once joined). */
let farewell = null;
let runCounter = 0;
let ghosts = [];
let running = false;
let charts = null;
let drawPending = false;
const hierarchies = new Map();

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

function shortName(s, task) {
  const on = task === 'digits' ? ' · digits' : '';
  if (s.algorithm === 'sync') return `sync SGD · R=${s.ranks}${on}`;
  if (s.algorithm === 'zero') return `ZeRO · R=${s.ranks}${on}`;
  if (s.algorithm === 'diloco') {
    return `${s.fragments > 1 ? 'streaming ' : ''}DiLoCo · R=${s.ranks} · H=${s.period}${s.fragments > 1 ? ` · F=${s.fragments}` : ''}${on}`;
  }
  return `${s.algorithm} · R=${s.ranks} · P=${s.period}${on}`;
}

function describeHierarchy(levels, ranks) {
  return levels
    .map(([period, size]) => {
      const where = size === ranks ? `over all ${ranks} ranks` : `within groups of ${size}`;
      return `every <b>${period}</b> step${period === 1 ? '' : 's'} ${where}`;
    })
    .join(', ');
}

/** Inapplicable controls are disabled (not only dimmed). */
function updateApplicable() {
  const algorithm = ui.algorithm.value;
  for (const field of document.querySelectorAll('[data-for]')) {
    const applies = field.dataset.for.split(' ').includes(algorithm);
    field.classList.toggle('disabled', !applies);
    for (const input of field.querySelectorAll('input, select')) input.disabled = !applies;
  }
}

function updateHelp() {
  const s = settings();
  updateApplicable();
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
    const key = `${s.period}/${s.ranks}`;
    const levels = hierarchies.get(key);
    if (!levels) worker.postMessage({ type: 'hierarchy', period: s.period, ranks: s.ranks });
    text = `<b>${s.warmup}</b> warm-up steps of synchronous SGD, then local steps; models averaged ${levels ? describeHierarchy(levels, s.ranks) : '…'} (<code>HierarchicalModelAverager</code>, the largest matching period wins).`;
  }
  // Trusted, fixed text (no user or error text goes through innerHTML).
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

function chip(color) {
  const span = document.createElement('span');
  span.className = 'chip';
  span.style.background = color;
  return span;
}

function renderShards() {
  const box = $('shards');
  box.textContent = '';
  const { ranks, classCounts } = run;
  for (let r = 0; r < ranks; r++) {
    const counts = classCounts[r];
    const total = counts.reduce((a, b) => a + b, 0) || 1;
    const row = document.createElement('div');
    row.className = 'shard';
    const label = document.createElement('span');
    label.append(chip(rankColor(r, ranks)), String(r));
    const bar = document.createElement('div');
    bar.className = 'bar';
    bar.setAttribute('role', 'img');
    const words = `rank ${r}: ${counts.map((c, k) => `${run.taskName === 'digits' ? 'digit' : 'class'} ${k}: ${c}`).join(', ')}`;
    bar.title = words;
    bar.setAttribute('aria-label', words);
    counts.forEach((c, k) => {
      const seg = document.createElement('span');
      seg.style.width = `${(100 * c) / total}%`;
      seg.style.background = CLASS_COLORS[k % CLASS_COLORS.length];
      bar.appendChild(seg);
    });
    row.append(label, bar);
    box.appendChild(row);
  }
  const legend = $('class-legend');
  legend.textContent = '';
  const classes = classCounts[0].length;
  for (let k = 0; k < classes; k++) {
    legend.append(chip(CLASS_COLORS[k % CLASS_COLORS.length]), `${k} `);
  }
}

// ---------------------------------------------------------------------------------------------
// Charts (uPlot): hover values in the legend, axis titles, ranks by hue and dash.

const AXIS = { stroke: '#aab3c2', grid: { stroke: 'rgba(255,255,255,0.07)' }, ticks: { stroke: 'rgba(255,255,255,0.15)' } };

function axes(xLabel, yLabel, yValues) {
  return [
    { ...AXIS, label: xLabel },
    { ...AXIS, label: yLabel, size: 64, ...(yValues ? { values: (u, ticks) => ticks.map(yValues) } : {}) },
  ];
}

function chartSize(el) {
  const width = Math.max(240, el.clientWidth || 600);
  return { width, height: el.classList.contains('tall') ? 280 : 220 };
}

function makeChart(el, label, series, axesSpec, scales = {}) {
  el.textContent = '';
  const u = new uPlot(
    {
      ...chartSize(el),
      series: [{ label: 'step' }, ...series],
      axes: axesSpec,
      scales: { x: { time: false }, ...scales },
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
    },
    [[]],
    el,
  );
  const canvas = u.root.querySelector('canvas');
  canvas.setAttribute('role', 'img');
  canvas.setAttribute('aria-label', label);
  return u;
}

const fixed = (digits) => (u, v) => (v == null ? '–' : v.toFixed(digits));
const percent = (u, v) => (v == null ? '–' : `${(100 * v).toFixed(1)}%`);
const bytesValue = (u, v) => (v == null ? '–' : formatBytes(v));

function ghostSeries(g, i, value) {
  return { label: g.label, stroke: GHOST_COLORS[i], dash: GHOST_DASH[i], width: 1.5, value, points: { show: false } };
}

function buildCharts() {
  const ranks = run.ranks;
  const acc = run.heldOut ? 'held-out accuracy' : 'accuracy on all shards';
  charts = {
    loss: makeChart(
      $('loss-chart'),
      `Training loss per rank and mean, by step, for ${run.label}; earlier runs dashed in grey`,
      [
        ...Array.from({ length: ranks }, (_, r) => ({
          label: `rank ${r}`,
          stroke: rankColor(r, ranks),
          dash: RANK_DASH[r % RANK_DASH.length],
          width: 1.2,
          value: fixed(3),
          points: { show: false },
        })),
        { label: 'mean', stroke: '#f3f6fa', width: 2.6, value: fixed(3), points: { show: false } },
        ...ghosts.map((g, i) => ghostSeries(g, i, fixed(3))),
      ],
      axes('step', 'loss (smoothed)'),
    ),
    accuracy: makeChart(
      $('accuracy-chart'),
      `Mean model's ${acc}, by step, for ${run.label}; earlier runs dashed in grey`,
      [
        { label: run.label, stroke: '#f5b454', width: 2.2, value: percent, points: { show: true, size: 6 } },
        ...ghosts.map((g, i) => ({ ...ghostSeries(g, i, percent), points: { show: true, size: 4 } })),
      ],
      axes('step', acc, (v) => `${Math.round(100 * v)}%`),
      { y: { range: [0, 1] } },
    ),
    divergence: makeChart(
      $('divergence-chart'),
      `Largest distance of a replica from the mean of the replicas, by step, for ${run.label}; dots mark model averaging or a DiLoCo sync`,
      [
        { label: 'divergence', stroke: '#5ee6c8', width: 1.8, value: fixed(3), points: { show: false } },
        {
          label: 'averaged / synced',
          stroke: '#ff7eb6',
          width: 0,
          paths: () => null,
          points: { show: true, size: 7, fill: '#ff7eb6' },
          value: (u, v) => (v == null ? '–' : 'yes'),
        },
      ],
      axes('step', '‖θᵣ − θ̄‖'),
    ),
    bytes: makeChart(
      $('bytes-chart'),
      `Bytes sent per rank, cumulative, by step, for ${run.label}; earlier runs dashed in grey`,
      [
        { label: run.label, stroke: '#7aa2ff', width: 2, value: bytesValue, points: { show: false } },
        ...ghosts.map((g, i) => ghostSeries(g, i, bytesValue)),
      ],
      axes('step', 'bytes sent per rank', (v) => formatBytes(v)),
    ),
  };
  demo.charts = charts;
}

function padded(values, n) {
  const out = new Array(n).fill(null);
  for (let i = 0; i < Math.min(n, values.length); i++) out[i] = values[i];
  return out;
}

/** The evaluations of a run on the grid `steps` (null where it has none). */
function onGrid(evaluations, steps) {
  const at = new Map(evaluations.map((e) => [e.step, e.accuracy]));
  return steps.map((s) => (at.has(s) ? at.get(s) : null));
}

function draw() {
  drawPending = false;
  if (!charts) return;
  renderRuns();
  const n = Math.max(run.history.length, ...ghosts.map((g) => g.loss.length), 1);
  const xs = Array.from({ length: n }, (_, i) => i + 1);
  charts.loss.setData([
    xs,
    ...run.lossPerRank.map((v) => padded(v, n)),
    padded(run.meanLoss, n),
    ...ghosts.map((g) => padded(g.loss, n)),
  ]);
  const marks = padded([], n);
  for (const i of run.marks) marks[i] = run.divergence[i];
  charts.divergence.setData([xs, padded(run.divergence, n), marks]);
  charts.bytes.setData([xs, padded(run.bytes, n), ...ghosts.map((g) => padded(g.bytes, n))]);
  const steps = [...new Set([...run.evaluations, ...ghosts.flatMap((g) => g.evaluations)].map((e) => e.step))].sort((a, b) => a - b);
  charts.accuracy.setData([steps, onGrid(run.evaluations, steps), ...ghosts.map((g) => onGrid(g.evaluations, steps))]);
  demo.framesDrawn++;
}

function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  if (document.hidden) setTimeout(draw, 50);
  else requestAnimationFrame(draw);
}

// ---------------------------------------------------------------------------------------------
// Runs

/**
 * The run a link invites to: {run, secret, settings, task}, or null (no run, or a broken link).
 * `secret` (the link's `k`) is the run's password on a server with a user per run.
 */
function invitation(params) {
  const name = params.get('run');
  if (!name || !/^[A-Za-z0-9_-]{1,64}$/.test(name)) return null;
  const secret = params.get('k') ?? undefined;
  if (secret !== undefined && !/^[A-Za-z0-9._~-]{8,128}$/.test(secret)) return null;
  try {
    const { settings, task, steps } = JSON.parse(atob(params.get('s') || ''));
    return Number.isInteger(settings?.ranks)
      ? { run: name, secret, settings, task: task === 'digits' ? 'digits' : 'synthetic', steps: stepsOf(steps) }
      : null;
  } catch {
    return null;
  }
}

/** `value` as a run's step count: a whole number from 1 to 10^6, else the default 1500. */
function stepsOf(value) {
  const steps = Number(value ?? NaN);
  return Number.isInteger(steps) && steps >= 1 && steps <= 1_000_000 ? steps : 1500;
}

/**
 * The link that invites other tabs into a new run of the current settings: the page's server
 * makes the run (`POST /runs`: its name, and the secret the link carries) where it admits runs
 * one by one; elsewhere the name is this tab's own draw.
 */
async function inviteLink(server) {
  let params;
  if (server.runs) {
    const response = await fetch(new URL(server.runs, location.href), { method: 'POST' });
    const answer = await response.json();
    if (!response.ok) throw new Error(`the demo's server made no run: ${answer.error ?? response.status}`);
    params = { run: answer.run, k: answer.secret };
  } else {
    params = { run: `demo-${Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, '0')).join('')}` };
  }
  params.s = btoa(JSON.stringify({ settings: settings(), task: ui.task.value, steps: runSteps }));
  const url = new URL(location.pathname, location.href);
  url.search = new URLSearchParams(params).toString();
  return url.href;
}

/**
 * The NATS server the page's server runs, as {websocket, runs} (its WebSocket listener, and
 * where to ask for a run), or null: scripts/demo.mjs answers config/nats.json itself, over
 * www/config/nats.json, which says there is none (so that a page served without one fetches no
 * missing file).
 */
async function natsServer() {
  try {
    const response = await fetch(new URL('./config/nats.json', location.href));
    if (!response.ok) return null;
    const { websocket, runs } = await response.json();
    return typeof websocket === 'string' ? { websocket, runs: typeof runs === 'string' ? runs : null } : null;
  } catch {
    return null;
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
      evaluations: run.evaluations,
    });
    ghosts = ghosts.slice(0, GHOST_COLORS.length);
    demo.ghosts = ghosts;
  }
  const s = networked ? networked.settings : settings();
  const task = networked ? networked.task : ui.task.value;
  const id = ++runCounter;
  run = {
    id,
    ready: false,
    task,
    label: shortName(s, task),
    name: shortName(s, task).split(' · ')[0],
    history: [],
    lossPerRank: Array.from({ length: s.ranks }, () => []),
    meanLoss: [],
    divergence: [],
    bytes: [],
    marks: [],
    evaluations: [],
    stepTimes: [],
    ranks: s.ranks,
  };
  demo.history = run.history;
  demo.evaluations = run.evaluations;
  updateHelp();
  if (networked) {
    worker.postMessage({ type: 'join', id, ws: networked.ws, run: networked.run, secret: networked.secret, settings: s, task, steps: runSteps });
  } else {
    worker.postMessage({ type: 'new', id, settings: s, task, steps: runSteps });
  }
}

/** The worker has built the run's trainer. */
function onRun(message) {
  if (!run || message.id !== run.id) return;
  demo.rank = message.rank;
  if (networked && message.leaving) {
    // What this rank says as the page goes (leave.js), on a connection of the page's own.
    farewell?.close();
    farewell = lastWord({ ws: networked.ws, run: networked.run, secret: networked.secret, leaving: message.leaving });
  }
  if (networked) {
    $('network-status').textContent = `This tab is rank ${message.rank} of ${message.ranks} in run ${networked.run}.`;
    // Every rank trains from here: the others are waiting for this one.
    running = true;
    ui.start.textContent = 'Training';
  }
  Object.assign(run, {
    ready: true,
    ranks: message.ranks,
    description: message.description,
    taskName: message.taskName,
    heldOut: message.heldOut,
    classCounts: message.classCounts,
    stateBytes: message.stateBytes,
  });
  run.evaluations.push(message.evaluation);
  $('footer-run').textContent = `${message.description} · ${message.taskDescription}`;
  $('accuracy-title').textContent = message.heldOut
    ? `Held-out accuracy of the mean model (${message.evaluation.samples} digits no rank trains on)`
    : 'Accuracy of the mean model (all shards)';
  $('stat-accuracy-label').textContent = message.heldOut ? 'Held-out accuracy' : 'Accuracy of the mean model';
  renderShards();
  buildCharts();
  updateStats();
  draw();
  if (running) worker.postMessage({ type: 'start', id: run.id });
}

/**
 * The run went on without this tab (it slept past the failure bound: a phone that suspended
 * it, a laptop closed): its worker joins again as a late rank. Said in the status line and the
 * run's log.
 */
function onRejoining(message) {
  if (!run || message.id !== run.id || !networked) return;
  $('network-status').textContent = `This tab was asleep and run ${networked.run} went on without it: joining again as the next rank that leaves, healed from a live rank at the next sync point.`;
  demo.rejoins = (demo.rejoins ?? 0) + 1;
  logMembership([`this tab was asleep and the run went on without it: joining again (${message.message})`]);
}

/** Ranks left or joined the run at a sync point: said in the run's log, newest first. */
function onMembership(message) {
  if (!run || message.id !== run.id) return;
  const lines = [
    ...message.left.map((r) => `rank ${r} left at step ${message.step}`),
    ...message.joined.map((r) => `rank ${r} joined at step ${message.step} (healed from a live rank)`),
  ];
  logMembership(lines);
}

/** `lines` added to the run's log, newest first. */
function logMembership(lines) {
  demo.membership = [...(demo.membership ?? []), ...lines];
  const log = $('membership-log');
  for (const line of lines) {
    const item = document.createElement('li');
    item.textContent = line;
    log.prepend(item);
  }
  log.hidden = false;
}

/** `value` smoothed after the series' last value (a gap, null, is skipped over). */
function smoothed(series, value) {
  const last = series.findLast((v) => v !== null);
  return last === undefined ? value : last + SMOOTHING * (value - last);
}

function record(report) {
  run.history.push(report);
  // A rank that was not training (it left a run over NATS, until a tab takes its place) has
  // no loss: a gap in its line.
  report.lossPerRank.forEach((loss, r) =>
    run.lossPerRank[r].push(Number.isFinite(loss) ? smoothed(run.lossPerRank[r], loss) : null),
  );
  run.meanLoss.push(smoothed(run.meanLoss, report.meanLoss));
  run.divergence.push(report.divergence);
  run.bytes.push(report.bytesCommunicatedPerRank);
  if (report.averaged !== null) run.marks.push(run.history.length - 1);
  run.stepTimes.push(performance.now());
  if (run.stepTimes.length > 120) run.stepTimes.shift();
}

function onSteps(message) {
  if (!run || message.id !== run.id) return;
  for (const report of message.reports) record(report);
  if (message.evaluation) run.evaluations.push(message.evaluation);
  updateStats();
  scheduleDraw();
}

/** Optimizer state per rank: one size, or the range over the ranks (ZeRO's shards differ). */
function formatStateBytes(perRank) {
  if (!perRank || !perRank.length || perRank.every((b) => b === 0)) return '–';
  const lo = Math.min(...perRank);
  const hi = Math.max(...perRank);
  return lo === hi ? formatBytes(hi) : `${formatBytes(lo)}–${formatBytes(hi)}`;
}

function updateStats() {
  const h = run.history;
  const last = h[h.length - 1];
  const evaluated = run.evaluations.at(-1);
  $('stat-step').textContent = String(h.length);
  $('stat-loss').textContent = last ? run.meanLoss[run.meanLoss.length - 1].toFixed(3) : '–';
  $('stat-divergence').textContent = last ? last.divergence.toFixed(3) : '–';
  $('stat-bytes').textContent = last ? formatBytes(last.bytesCommunicatedPerRank) : '–';
  $('stat-state').textContent = formatStateBytes(last ? last.optimizerStateBytesPerRank : run.stateBytes);
  $('stat-accuracy').textContent = evaluated && h.length ? `${(100 * evaluated.accuracy).toFixed(1)}%` : '–';
  const t = run.stepTimes;
  const speed = t.length > 1 ? ((t.length - 1) * 1000) / (t[t.length - 1] - t[0]) : NaN;
  $('stat-speed').textContent = Number.isFinite(speed) && running ? speed.toFixed(speed < 10 ? 1 : 0) : '–';
}

/** The runs table: every run's numbers at the current run's step (or its last). */
function renderRuns() {
  const body = $('runs');
  const at = Math.max(run.history.length - 1, 0);
  const row = (label, loss, evaluations, divergence, bytes, steps, color, cls) => {
    const i = Math.min(at, steps - 1);
    const perStep = i >= 0 ? bytes[i] / (i + 1) : NaN;
    const cell = (v, f) => (i >= 0 && Number.isFinite(v) ? f(v) : '–');
    // The last evaluation at or before step i + 1 (after the first step).
    const evaluated = evaluations.filter((e) => e.step > 0 && e.step <= i + 1).at(-1);
    const tr = document.createElement('tr');
    tr.className = cls;
    const name = document.createElement('td');
    const swatch = document.createElement('span');
    swatch.className = 'swatch';
    swatch.style.borderColor = color;
    name.append(swatch, label);
    const values = [
      String(Math.max(0, Math.min(at + 1, steps))),
      cell(loss[i], (v) => v.toFixed(3)),
      evaluated ? `${(100 * evaluated.accuracy).toFixed(1)}%` : '–',
      cell(divergence[i], (v) => v.toFixed(3)),
      cell(bytes[i], formatBytes),
      cell(perStep, formatBytes),
    ];
    tr.append(name, ...values.map((v) => Object.assign(document.createElement('td'), { textContent: v })));
    return tr;
  };
  body.replaceChildren(
    row(run.label, run.meanLoss, run.evaluations, run.divergence, run.bytes, run.history.length, '#f3f6fa', 'current'),
    ...ghosts.map((g, k) => row(g.label, g.loss, g.evaluations, g.divergence, g.bytes, g.loss.length, GHOST_COLORS[k], 'ghost')),
  );
}

function setRunning(on) {
  running = on;
  ui.start.textContent = on ? 'Pause' : run && run.history.length ? 'Resume' : 'Start';
  ui.start.setAttribute('aria-pressed', String(on));
  if (on && run && run.ready) worker.postMessage({ type: 'start', id: run.id });
  if (!on) worker.postMessage({ type: 'pause' });
  if (run && run.ready) updateStats();
}

// ---------------------------------------------------------------------------------------------
// The adapter line (announced: aria-live) and errors (as text, never innerHTML).

function setAdapterLine(kind, strong, rest, sub) {
  const text = $('adapter').querySelector('.text');
  const b = document.createElement('b');
  b.textContent = strong;
  const parts = [b, rest];
  if (sub) {
    const s = document.createElement('span');
    s.className = 'sub';
    s.textContent = sub;
    parts.push(s);
  }
  text.replaceChildren(...parts);
  $('adapter').className = `adapter ${kind}`;
}

function showError(error) {
  setAdapterLine('error', error.name || 'Error', `: ${error.message}`);
  console.error(`${error.name || 'Error'}: ${error.message}`);
}

function showAdapter(info, choice) {
  const box = $('adapter');
  box.dataset.kind = info.kind;
  const a = info.adapterInfo;
  const detail = a ? [a.vendor, a.architecture].filter(Boolean).join(' · ') : '';
  const threads = info.threads > 1 ? `on ${info.threads} threads (Web Workers)` : 'on one thread (in a Web Worker)';
  if (info.kind === 'gpu') {
    setAdapterLine('gpu', 'WebGPU', ` · ${info.name}`, `${detail}${a && a.isFallbackAdapter ? ' · software (fallback) adapter' : ''}`);
  } else if (choice === 'cpu') {
    setAdapterLine('cpu', 'CPU backend', ' · as selected', `distopt's plain-Rust backend, compiled to WebAssembly, ${threads}`);
  } else if (a) {
    setAdapterLine(
      'cpu',
      'CPU backend',
      " · faster than this browser's software WebGPU adapter",
      `WebGPU offers only ${a.description || detail || 'a software adapter'}${a.description && detail ? ` (${detail})` : ''}; pick “WebGPU” under Backend to use it anyway`,
    );
  } else {
    setAdapterLine('cpu', 'CPU fallback', ' · WebGPU is not available in this browser', `distopt's plain-Rust backend, compiled to WebAssembly, ${threads}`);
  }
  box.title = info.reason;
}

let pendingBackend = null;

function changeBackend() {
  pendingBackend = { choice: ui.backend.value, wasRunning: running };
  running = false;
  worker.postMessage({ type: 'backend', choice: ui.backend.value });
}

function onBackend(info) {
  const { choice, wasRunning } = pendingBackend || { choice: ui.backend.value, wasRunning: false };
  pendingBackend = null;
  info.adapterInfo = demo.info && demo.info.adapterInfo;
  demo.info = info;
  demo.backend = choice;
  showAdapter(info, choice);
  restart(wasRunning);
}

function onError(message) {
  if (pendingBackend) {
    ui.backend.value = demo.backend;
    pendingBackend = null;
    showError(message);
    setTimeout(() => showAdapter(demo.info, demo.backend), 4000);
    return;
  }
  running = false;
  ui.start.textContent = 'Start';
  showError(message);
}

/** A networked tab: the run's settings shown and fixed, the invitation shown, then joined. */
async function joinNetworked() {
  const ws = (await natsServer())?.websocket;
  if (!ws) {
    showError({ name: 'Error', message: 'this page was opened from an invitation, but its server runs no NATS server (start it with scripts/demo.sh)' });
    return;
  }
  networked.ws = ws;
  const s = networked.settings;
  for (const [input, value] of [[ui.ranks, s.ranks], [ui.period, s.period], [ui.warmup, s.warmup], [ui.lr, s.lr], [ui.skew, s.task?.heterogeneity], [ui.fragments, s.fragments]]) {
    if (value !== undefined) input.value = String(value);
  }
  ui.algorithm.value = s.algorithm;
  ui.task.value = networked.task;
  for (const input of [...Object.values(ui)]) input.disabled = true;
  updateOutputs();
  updateApplicable();
  $('subtitle').textContent = 'data-parallel training across tabs and devices';
  $('network').hidden = false;
  $('invite').hidden = true;
  const link = $('invite-link');
  link.href = location.href;
  link.textContent = location.href;
  link.hidden = false;
  // The link as a QR code, for a phone (where the page's server is reachable from it).
  const qr = qrcode(0, 'M');
  qr.addData(location.href);
  qr.make();
  $('invite-qr').innerHTML = qr.createSvgTag({ cellSize: 3, margin: 2, alt: 'the invitation link as a QR code' });
  $('invite-qr').hidden = false;
  $('network-status').textContent = `Waiting for all ${s.ranks} ranks of run ${networked.run}: open the link below in other tabs or on other devices.`;
  newRun();
}

function onReady(message) {
  const { info } = message;
  const backend = demo.backend;
  demo.info = info;
  showAdapter(info, backend);
  $('version').textContent = message.version;
  if (networked) {
    joinNetworked();
    demo.ready = true;
    return;
  }
  newRun();
  natsServer().then((server) => {
    if (!server) return;
    $('network').hidden = false;
    $('invite').addEventListener('click', () =>
      inviteLink(server).then(
        (link) => location.assign(link),
        (error) => showError({ name: 'Error', message: error.message }),
      ),
    );
  });
  for (const input of [ui.ranks, ui.period, ui.warmup, ui.fragments, ui.lr, ui.skew]) {
    input.addEventListener('input', () => {
      updateOutputs();
      updateHelp();
    });
    input.addEventListener('change', () => restart());
  }
  ui.algorithm.addEventListener('change', () => restart());
  ui.task.addEventListener('change', () => restart());
  ui.backend.addEventListener('change', () => changeBackend());
  ui.start.addEventListener('click', () => setRunning(!running));
  ui.reset.addEventListener('click', () => restart());
  ui.start.disabled = false;
  ui.reset.disabled = false;
  let resizeTimer;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      if (!charts) return;
      for (const [key, u] of Object.entries(charts)) u.setSize(chartSize($(`${key}-chart`)));
    }, 100);
  });
  demo.ready = true;
}

worker.onmessage = (event) => {
  const message = event.data;
  demo.messages++;
  switch (message.type) {
    case 'ready':
      onReady(message);
      break;
    case 'backend':
      onBackend(message.info);
      break;
    case 'hierarchy':
      hierarchies.set(`${message.period}/${message.ranks}`, message.levels);
      updateHelp();
      break;
    case 'joining':
      if (networked) {
        $('network-status').textContent = message.late
          ? `Run ${networked.run} is under way with all its ${networked.settings.ranks} ranks: this tab joins as the next rank that leaves, and is healed from a live rank at the next sync point.`
          : `${$('network-status').textContent} Connected to the server; joining…`;
      }
      break;
    case 'rejoining':
      onRejoining(message);
      break;
    case 'membership':
      onMembership(message);
      break;
    case 'run':
      onRun(message);
      break;
    case 'steps':
      onSteps(message);
      break;
    case 'stopped':
      if (run && message.id === run.id && message.done) {
        running = false;
        ui.start.textContent = 'Start';
        ui.start.setAttribute('aria-pressed', 'false');
        updateStats();
      }
      break;
    case 'error':
      onError(message);
      break;
    default:
      break;
  }
};
worker.onerror = (event) => showError({ name: 'Error', message: event.message || 'the training worker failed to start' });

// A rank's tab that closes, reloads or is navigated away tells its run that it leaves: the
// other ranks count it gone half a second later instead of after the 5 s failure bound, and go
// on without it at their next sync point. The page says it itself (leave.js: its worker may be
// blocked in a step), and the worker stops. A tab the browser restores from its back-forward
// cache has left, so it loads again (and joins as a late rank, healed from a live one).
addEventListener('pagehide', () => {
  if (!networked) return;
  farewell?.send();
  worker.postMessage({ type: 'leave' });
});
addEventListener('pageshow', (event) => {
  if (networked && event.persisted) location.reload();
});

function restart(wasRunning = running) {
  running = false;
  worker.postMessage({ type: 'pause' });
  newRun();
  setRunning(wasRunning);
}

function main() {
  updateOutputs();
  updateApplicable();
  const params = new URLSearchParams(location.search);
  // A networked rank runs on the CPU backend (a GPU readback cannot block its thread).
  const backend = networked ? 'cpu' : params.get('backend') || 'auto';
  if (params.get('task') === 'digits') ui.task.value = 'digits';
  demo.backend = backend;
  ui.backend.value = backend;
  worker.postMessage({ type: 'init', backend });
}

main();
