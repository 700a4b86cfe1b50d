// trainforge dashboard: keeps the server-rendered pages live over the API's server-sent events.
// No framework, no build step. uPlot (vendored) draws the charts.
import { STATES, api, follow, notice } from "./page.js";
import { fmtBytes } from "./units.js";

const main = document.getElementById("page");
const kind = main.dataset.kind;
const pageData = JSON.parse(main.dataset.page || "{}");
// The job states and event types come from the server (page.js: its JobState and JobEvent enums).
const TERMINAL = new Set(STATES.terminal || []);

// A job's action buttons (rendered by the server; the same on every page).
async function act(button) {
  const id = Number(button.dataset.job);
  const what = button.dataset.act;
  button.disabled = true;
  try {
    let job;
    if (what === "stop") job = await api("POST", `/jobs/${id}/stop`, {});
    else if (what === "retry") job = await api("POST", `/jobs/${id}/retry`, {});
    else if (what === "hold") job = await api("PATCH", `/jobs/${id}`, { hold: true });
    else if (what === "release") job = await api("PATCH", `/jobs/${id}`, { hold: false });
    else if (what === "priority") {
      const value = window.prompt(`Priority of job ${id} (higher starts first):`, "0");
      if (value === null) return;
      job = await api("PATCH", `/jobs/${id}`, { priority: Number(value) });
    }
    notice(`job ${id}: ${job.state}`);
    if (kind === "jobs") await refreshRow(id);
    else if (kind === "job") await refreshJob();
  } catch (err) {
    notice(`job ${id}: ${err.message}`, true);
  } finally {
    button.disabled = false;
  }
}

document.addEventListener("click", (ev) => {
  const button = ev.target.closest("button.act");
  if (button) act(button);
});

// -- jobs page ----------------------------------------------------------------------------------------
async function refreshRow(id) {
  const r = await fetch(`/rows/${id}`, { credentials: "same-origin" });
  if (!r.ok) return;
  const html = await r.text();
  const body = document.getElementById("jobs");
  const template = document.createElement("template");
  template.innerHTML = html.trim();
  const row = template.content.firstElementChild;
  if (!row) return;
  const old = document.getElementById(`job-${id}`);
  if (old) old.replaceWith(row);
  else if (!pageData.filtered) {
    body.querySelector("tr.empty")?.remove();
    body.prepend(row);
  }
}

function jobsPage() {
  const pending = new Set();
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    const ids = [...pending];
    pending.clear();
    ids.forEach((id) => refreshRow(id));
  };
  const onEvent = (data) => {
    pending.add(data.job_id);
    if (!scheduled) {
      scheduled = true;
      setTimeout(flush, 100); // one refresh per job per 100 ms, however many events arrive
    }
  };
  const handlers = {};
  for (const name of STATES.events || []) handlers[name] = onEvent; // any change of any job
  handlers.deleted = (data) => document.getElementById(`job-${data.job_id}`)?.remove();
  follow("/events", handlers);
  // Running jobs' last metrics and durations move without lifecycle events (the server marks their rows).
  setInterval(() => {
    document.querySelectorAll("#jobs tr[data-live]").forEach((tr) => pending.add(Number(tr.id.slice(4))));
    if (pending.size && !scheduled) { scheduled = true; setTimeout(flush, 0); }
  }, 2000);
}

// -- job page -----------------------------------------------------------------------------------------
const PREFIXES = ["train_", "val_", "valid_", "validation_", "eval_", "test_", "train/", "val/", "valid/", "eval/", "test/"];
const SUFFIXES = ["_train", "_val", "_valid", "_eval", "_test"];
// Metrics that count reports (the x axis already does): no chart of their own.
const COUNTERS = new Set(["step", "training_iteration"]);
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];

function groupOf(key) {
  for (const p of PREFIXES) if (key.startsWith(p) && key.length > p.length) return key.slice(p.length);
  for (const s of SUFFIXES) if (key.endsWith(s) && key.length > s.length) return key.slice(0, -s.length);
  return key;
}

function asNumber(v) {
  if (typeof v === "number") return v;
  if (v === "nan" || v === "NaN") return NaN;
  if (v === "inf" || v === "Infinity") return Infinity;
  if (v === "-inf" || v === "-Infinity") return -Infinity;
  return undefined;
}

class Charts {
  // Each key's series as three aligned columns: last, min, max. Loaded from the server's buckets
  // (/series: min/max keep a spike visible however long the run), then raw reports appended live
  // (min = max = last for those). Each point belongs to a segment (a job attempt, a run, a restart:
  // /series' "segments", then the run_start and restart events): the lines break between two
  // segments and the break is labelled, so a requeued job's repeated steps never join the first ones.
  constructor(box) {
    this.box = box;
    this.steps = [];
    this.times = [];
    this.segments = []; // {run, job_attempt, attempt}, numbered as the server numbers them
    this.segOf = []; // the segment of each point
    this.count = 0; // reports so far (the step index of the next one)
    this.series = new Map(); // key -> {last, min, max}
    this.banded = false; // some bucket holds more than one report: draw min/max faintly
    this.charts = new Map(); // group -> {plot, keys, el}
    this.dirty = false;
    this.refined = null; // {el, t0}: a zoom's finer data to announce once drawn
    this.x = "step";
    this.log = false;
    this.smooth = 0;
    this.observer = new IntersectionObserver((entries) => {
      for (const e of entries) e.target.dataset.visible = e.isIntersecting ? "1" : "";
      this.schedule();
    });
  }

  column(key) {
    let c = this.series.get(key);
    if (!c) {
      const n = this.steps.length;
      c = { last: new Array(n).fill(null), min: new Array(n).fill(null), max: new Array(n).fill(null) };
      this.series.set(key, c);
    }
    return c;
  }

  load(s) {
    const keys = Object.keys(s.series);
    const first = keys.length ? s.series[keys[0]] : { i: [], t: [] };
    this.steps = [...first.i];
    this.times = first.t.map((t) => t ?? null);
    this.segments = s.segments || [];
    this.segOf = first.segment ? [...first.segment] : first.i.map(() => 0);
    this.count = s.n;
    this.banded = s.n > first.i.length;
    for (const key of keys) {
      const b = s.series[key];
      this.series.set(key, { last: [...b.last], min: [...b.min], max: [...b.max] });
    }
    this.schedule();
  }

  // A run_start (job_attempt from the event) or a restart (attempt) begins the next segment.
  segment(ev) {
    const last = this.segments[this.segments.length - 1] || {};
    this.segments.push(ev.type === "restart"
      ? { run: last.run ?? null, job_attempt: last.job_attempt ?? null, attempt: ev.attempt }
      : { run: ev.name ?? null, job_attempt: ev.job_attempt ?? null, attempt: 0 });
  }

  add(metrics, t) {
    const n = this.steps.length;
    if (!this.segments.length) this.segments.push({ run: null, job_attempt: null, attempt: 0 });
    this.steps.push(this.count);
    this.times.push(t);
    this.segOf.push(this.segments.length - 1);
    this.count += 1;
    for (const [key, raw] of Object.entries(metrics || {})) {
      const v = asNumber(raw);
      if (v === undefined) continue;
      const c = this.column(key);
      const value = Number.isFinite(v) ? v : null; // NaN and infinities: a gap
      c.last.push(value);
      c.min.push(value);
      c.max.push(value);
    }
    for (const c of this.series.values()) {
      if (c.last.length < n + 1) { c.last.push(null); c.min.push(null); c.max.push(null); }
    }
    this.schedule();
  }

  schedule() {
    if (this.dirty) return;
    this.dirty = true;
    requestAnimationFrame(() => { this.dirty = false; this.draw(); });
  }

  ema(values) {
    if (!this.smooth) return null;
    const out = new Array(values.length);
    let acc = null;
    for (let i = 0; i < values.length; i++) {
      if (i > 0 && this.segOf[i] !== this.segOf[i - 1]) acc = null; // each segment smoothed on its own
      const v = values[i];
      if (v === null) { out[i] = acc; continue; }
      acc = acc === null ? v : acc * this.smooth + v * (1 - this.smooth);
      out[i] = acc;
    }
    return out;
  }

  groups() {
    const groups = new Map();
    // A reported step counter would be charted against the x axis, itself the report index: a
    // diagonal line. It is left out (unless it is all there is).
    const keys = [...this.series.keys()].sort();
    const measured = keys.filter((k) => !COUNTERS.has(k));
    for (const key of measured.length ? measured : keys) {
      const g = groupOf(key);
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push(key);
    }
    return groups;
  }

  layout() {
    return `${this.banded}/${this.smooth > 0}`;
  }

  draw() {
    const empty = document.getElementById("nometrics");
    if (this.series.size && empty) empty.remove();
    const xs = this.x === "time" ? this.times : this.steps;
    const cuts = this.cuts();
    for (const [group, keys] of this.groups()) {
      let chart = this.charts.get(group);
      if (chart && (chart.keys.join() !== keys.join() || chart.layout !== this.layout())) {
        chart.plot.destroy();
        chart.el.remove();
        chart = null;
      }
      if (!chart) chart = this.create(group, keys);
      if (chart.el.dataset.visible !== "1" && chart.plot) { chart.stale = true; continue; }
      const data = [xs];
      for (const key of keys) {
        const c = this.series.get(key);
        data.push(c.last);
        if (this.banded) data.push(c.min, c.max);
        const smoothed = this.ema(c.last);
        if (smoothed) data.push(smoothed);
      }
      chart.marks = cuts.map((j) => ({ x: gapAt(xs, j), label: this.label(j) }));
      chart.el.dataset.segments = chart.marks.map((m) => m.label).join("|");
      chart.plot.setData(withGaps(data, cuts), !chart.zoomed); // a zoom survives live updates
      chart.stale = false;
      chart.el.querySelector(".last").textContent = keys.map((k) => {
        const v = this.series.get(k).last;
        const last = v[v.length - 1];
        return `${k}: ${last === null || last === undefined ? "—" : Number(last).toPrecision(5)}`;
      }).join("   ");
    }
    if (this.refined) {
      const { el, t0, buckets, reports } = this.refined;
      this.refined = null;
      // After the frame that paints it: uPlot draws on a microtask after setData.
      requestAnimationFrame(() => el.dispatchEvent(new CustomEvent("tf-refined", {
        detail: { ms: performance.now() - t0, buckets, reports },
      })));
    }
  }

  create(group, keys) {
    const el = document.createElement("div");
    el.className = "chart";
    el.dataset.group = group;
    const title = document.createElement("h3");
    title.textContent = group;
    const last = document.createElement("div");
    last.className = "last";
    el.append(title, last);
    this.box.appendChild(el);
    const series = [{ label: this.x }];
    keys.forEach((key, i) => {
      const color = COLORS[i % COLORS.length];
      series.push({ label: key, stroke: this.smooth ? color + "55" : color, width: 1, spanGaps: false });
      if (this.banded) {
        series.push({ label: `${key} min`, stroke: color + "33", width: 1 });
        series.push({ label: `${key} max`, stroke: color + "33", width: 1 });
      }
      if (this.smooth) series.push({ label: `${key} (smoothed)`, stroke: color, width: 2 });
    });
    const width = Math.max(320, Math.min(640, this.box.clientWidth - 16));
    const chart = { el, keys, zoomed: false, stale: false, plot: null, layout: this.layout(), marks: [] };
    const opts = {
      width, height: 220, series,
      scales: { x: { time: this.x === "time" }, y: this.log ? { distr: 3 } : {} },
      axes: [{}, { size: 60 }],
      cursor: { drag: { x: true, y: false } },
      legend: { live: true },
      hooks: { setSelect: [(u) => {
        if (u.select.width <= 0) return;
        chart.zoomed = true;
        this.refine(chart, u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x"));
      }], draw: [(u) => drawMarks(u, chart.marks)] },
    };
    chart.plot = new uPlot(opts, series.map(() => []), el);
    el.addEventListener("dblclick", () => { chart.zoomed = false; this.schedule(); }); // uPlot resets the zoom
    el.dataset.visible = "1";
    this.observer.observe(el);
    this.charts.set(group, chart);
    return chart;
  }

  // A zoom into downsampled buckets asks the server for that range of reports cut into finer
  // buckets and splices them in place of the coarse ones, so zooming into a million reports ends
  // on the reports themselves. The chart's element then gets a "tf-refined" event (its detail: ms
  // from the mouse release to the finer data drawn).
  async refine(chart, from, to) {
    if (!this.banded) return;
    const t0 = performance.now();
    const xs = this.x === "time" ? this.times : this.steps;
    let a = xs.findIndex((x) => x !== null && x >= from);
    let b = xs.length - 1;
    while (b > 0 && (xs[b] === null || xs[b] > to)) b--;
    if (a < 0 || b < a) return;
    a = Math.max(0, a - 1); b = Math.min(xs.length - 1, b + 1); // the buckets at the edges too
    const lo = a > 0 ? this.steps[a - 1] + 1 : 0;
    const hi = this.steps[b];
    if (hi - lo + 1 <= b - a + 1) return; // already one bucket per report there
    const points = Math.max(200, 2 * chart.plot.width);
    const s = await api("GET", `/jobs/${pageData.job.id}/series?start=${lo}&end=${hi}&points=${points}`);
    if (this.steps[a] === undefined || this.steps[b] !== hi) return; // replaced by a newer refine
    const keys = Object.keys(s.series);
    const first = keys.length ? s.series[keys[0]] : { i: [], t: [] };
    const count = b - a + 1;
    this.steps.splice(a, count, ...first.i);
    this.times.splice(a, count, ...first.t.map((t) => t ?? null));
    this.segOf.splice(a, count, ...(first.segment || first.i.map(() => this.segOf[a])));
    const empty = new Array(first.i.length).fill(null);
    for (const [key, c] of this.series) {
      const f = s.series[key] || { last: empty, min: empty, max: empty };
      c.last.splice(a, count, ...f.last);
      c.min.splice(a, count, ...f.min);
      c.max.splice(a, count, ...f.max);
    }
    this.refined = { el: chart.el, t0, buckets: first.i.length, reports: hi - lo + 1 };
    this.schedule();
  }

  // The indices of the points that begin a segment (the first point aside).
  cuts() {
    const cuts = [];
    for (let j = 1; j < this.segOf.length; j++) if (this.segOf[j] !== this.segOf[j - 1]) cuts.push(j);
    return cuts;
  }

  // What began at point j: the run restarted (its restart count), the job's next attempt, or a run.
  label(j) {
    const was = this.segments[this.segOf[j - 1]] || {};
    const now = this.segments[this.segOf[j]] || {};
    if (now.attempt > 0) return `restart ${now.attempt}`;
    if (now.job_attempt != null && now.job_attempt !== was.job_attempt) return `attempt ${now.job_attempt}`;
    return `run ${now.run}`;
  }

  rebuild() {
    for (const chart of this.charts.values()) { chart.plot.destroy(); chart.el.remove(); }
    this.charts.clear();
    this.schedule();
  }
}

// Where a chart breaks between points j-1 and j: halfway.
function gapAt(xs, j) {
  const a = xs[j - 1] ?? xs[j];
  const b = xs[j] ?? a;
  return (a + b) / 2;
}

// uPlot's data with a null point at each cut (halfway between the points either side): with spanGaps
// off, every line breaks there.
function withGaps(data, cuts) {
  if (!cuts.length) return data;
  const xs = data[0];
  return data.map((column, k) => {
    const out = [];
    let from = 0;
    for (const j of cuts) {
      for (let i = from; i < j; i++) out.push(column[i]);
      out.push(k === 0 ? gapAt(xs, j) : null);
      from = j;
    }
    for (let i = from; i < column.length; i++) out.push(column[i]);
    return out;
  });
}

// A dashed line at each break, labelled with what began there ("attempt 2", "restart 1").
function drawMarks(u, marks) {
  if (!marks || !marks.length) return;
  const ctx = u.ctx;
  const { top, height, left, width } = u.bbox;
  ctx.save();
  ctx.strokeStyle = "#888";
  ctx.fillStyle = "#666";
  ctx.setLineDash([4, 4]);
  ctx.font = `${Math.round(11 * devicePixelRatio)}px sans-serif`;
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  for (const { x, label } of marks) {
    const px = Math.round(u.valToPos(x, "x", true));
    if (px < left || px > left + width) continue;
    ctx.beginPath();
    ctx.moveTo(px, top);
    ctx.lineTo(px, top + height);
    ctx.stroke();
    ctx.fillText(label, px + 3 * devicePixelRatio, top + 2 * devicePixelRatio);
  }
  ctx.restore();
}

async function refreshJob() {
  const id = pageData.job.id;
  const job = await api("GET", `/jobs/${id}`);
  const state = document.getElementById("state");
  state.textContent = job.state;
  state.className = `state s-${job.state}`;
  const r = await fetch(`/rows/${id}`, { credentials: "same-origin" }); // the same buttons as the jobs table
  if (r.ok) {
    const template = document.createElement("template");
    template.innerHTML = `<table><tbody>${await r.text()}</tbody></table>`;
    const cell = template.content.querySelector("td.actions");
    document.getElementById("actions").innerHTML = cell ? cell.innerHTML : "";
  }
  const error = document.getElementById("error");
  error.hidden = !job.error;
  error.textContent = job.error || "";
  return job;
}

async function loadEvents() {
  const id = pageData.job.id;
  const events = await api("GET", `/jobs/${id}/events?limit=1000`);
  const body = document.getElementById("events");
  body.replaceChildren(...events.map((e) => {
    const tr = document.createElement("tr");
    const detail = e.payload && Object.keys(e.payload).length ? JSON.stringify(e.payload) : "";
    for (const text of [e.seq, new Date(e.ts * 1000).toLocaleTimeString(), e.type, detail]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    return tr;
  }));
}

// The command that resumes from a checkpoint: a trainer or function job is retried from it by the
// server; a script builds its own trainer, so the line to put in it.
function resumeCommand(job, path) {
  const quoted = `'${path.replaceAll("'", "'\\''")}'`;
  if (job.kind === "script") return `resume_from_checkpoint=trainforge.Checkpoint(${JSON.stringify(path)})`;
  return `trainforge retry ${job.id} --checkpoint ${quoted}`;
}

async function loadCheckpoints() {
  const id = pageData.job.id;
  const { checkpoints } = await api("GET", `/jobs/${id}/checkpoints`);
  const body = document.getElementById("checkpoints");
  body.replaceChildren(...checkpoints.map((c) => {
    const tr = document.createElement("tr");
    const metrics = Object.entries(c.metrics || {}).slice(0, 6).map(([k, v]) => `${k}=${v}`).join(" ");
    for (const text of [c.index, metrics, fmtBytes(c.size), c.checkpoint]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    const td = document.createElement("td");
    td.className = "resume";
    const code = document.createElement("code");
    code.textContent = resumeCommand(pageData.job, c.checkpoint);
    const copy = document.createElement("button");
    copy.textContent = "Copy";
    copy.className = "copy";
    copy.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(code.textContent);
        notice("Copied: " + code.textContent);
      } catch {
        getSelection().selectAllChildren(code); // no clipboard access: select it for Ctrl-C
      }
    });
    td.append(code, copy);
    tr.appendChild(td);
    return tr;
  }));
}

async function loadUsage() {
  const id = pageData.job.id;
  const usage = await api("GET", `/jobs/${id}/usage`);
  document.getElementById("gpu").textContent = usage.gpu === "ok" ? "GPU readings from NVML" : usage.gpu;
  if (!usage.processes.length) return;
  const body = document.getElementById("usage");
  body.replaceChildren(...usage.processes.map((p) => {
    const tr = document.createElement("tr");
    const cells = [p.role, p.pid, `${p.cpu_percent.toFixed(0)}%`, fmtBytes(p.rss), p.threads,
      p.gpu_memory === undefined ? "—" : fmtBytes(p.gpu_memory),
      p.gpu_util === undefined ? "—" : `${p.gpu_util.toFixed(0)}%`];
    for (const text of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    return tr;
  }));
}

function logs(isEnded) {
  const id = pageData.job.id;
  const pre = document.getElementById("log");
  const followBox = document.getElementById("follow");
  const rankSelect = document.getElementById("rank");
  let first = 0;
  const MAX_CHARS = 2_000_000; // what the page keeps; older text is a click away
  const append = (text) => {
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40;
    pre.append(text);
    if (pre.textContent.length > MAX_CHARS) pre.textContent = pre.textContent.slice(-MAX_CHARS);
    if (followBox.checked && atBottom) pre.scrollTop = pre.scrollHeight;
  };
  // Followed by polling, not a second event stream: a browser keeps at most 6 connections to a
  // server over HTTP/1.1, and each open EventSource holds one for as long as the tab is open.
  let next = 0;
  let generation = 0;
  const poll = async (mine) => {
    if (mine !== generation) return;
    const rank = rankSelect.value;
    const ended = isEnded(); // read before the request: its text is then complete
    try {
      const chunk = await api("GET", `/jobs/${id}/logs?offset=${next}${rank === "" ? "" : `&rank=${rank}`}`);
      if (mine !== generation) return;
      if (chunk.text) append(chunk.text);
      next = chunk.next_offset;
      if (chunk.next_offset < chunk.size) { poll(mine); return; } // more is there already
      if (ended) return; // the job ended before that read: nothing more will come
    } catch (_) { /* the server restarts: try again */ }
    setTimeout(() => poll(mine), 500);
  };
  const open = async () => {
    generation += 1;
    const rank = rankSelect.value;
    const q = rank === "" ? "" : `&rank=${rank}`;
    const chunk = await api("GET", `/jobs/${id}/logs?tail=1000${q}`);
    first = chunk.offset;
    next = chunk.next_offset;
    pre.textContent = chunk.text;
    pre.scrollTop = pre.scrollHeight;
    poll(generation);
  };
  rankSelect.addEventListener("change", open);
  document.getElementById("older").addEventListener("click", async () => {
    if (first <= 0) return;
    const rank = rankSelect.value;
    const start = Math.max(0, first - 65536);
    const chunk = await api("GET", `/jobs/${id}/logs?offset=${start}${rank === "" ? "" : `&rank=${rank}`}`);
    const bytes = new TextEncoder().encode(chunk.text).slice(0, first - start);
    const height = pre.scrollHeight;
    pre.prepend(new TextDecoder().decode(bytes));
    pre.scrollTop += pre.scrollHeight - height;
    first = start;
  });
  open();
}

function jobPage() {
  const id = pageData.job.id;
  const charts = new Charts(document.getElementById("charts"));
  document.getElementById("xaxis").addEventListener("change", (e) => { charts.x = e.target.value; charts.rebuild(); });
  document.getElementById("logscale").addEventListener("change", (e) => { charts.log = e.target.checked; charts.rebuild(); });
  document.getElementById("smooth").addEventListener("change", (e) => { charts.smooth = Number(e.target.value); charts.rebuild(); });
  let ended = TERMINAL.has(pageData.job.state);
  const changed = () => { refreshJob().then((job) => { ended = TERMINAL.has(job.state); }); loadEvents(); loadCheckpoints(); };
  // The history, downsampled by the server, then the job's events from where it ended.
  api("GET", `/jobs/${id}/series?points=${Math.max(500, 2 * window.innerWidth)}`).then((s) => {
    charts.load(s);
    follow(`/jobs/${id}/stream?offset=${s.next_offset}`, {
      report: (ev) => charts.add(ev.metrics, ev.t),
      run_start: (ev) => { charts.segment(ev); changed(); },
      restart: (ev) => { charts.segment(ev); changed(); },
      run_end: changed,
      end: (job, ev) => { changed(); ev.target.close(); },
    });
  });
  setInterval(() => {
    if (ended) return;
    refreshJob().then((job) => { ended = TERMINAL.has(job.state); });
    loadUsage();
  }, 2000);
  loadUsage();
  loadEvents();
  loadCheckpoints();
  logs(() => ended);
}

// -- compare page -------------------------------------------------------------------------------------
// One metric of several jobs on one chart (x: the step index), each job coloured by the value of the
// grouping key (the experiments page's colour scales: a colour per value for a few, a continuous scale
// with rounded ends for a numeric key of many values), so jobs that share a value share a colour; a
// job's own legend entry only when there are few; running jobs refresh every 3 s.
const COMPARE_LEGEND_MAX = 10;

async function comparePage() {
  const box = document.getElementById("compare");
  if (!box) return;
  const [{ colorScale }, { short }] = await Promise.all([import("./expcharts.js"), import("./parcoords.js")]);
  const { jobs, metric, group } = pageData;
  const scale = colorScale(jobs.map((j) => j.value));
  const colorOf = (j) => scale.color(j.value);
  const valueText = (v) => (typeof v === "number" ? short(v) : String(v ?? "—"));
  const legendBox = document.getElementById("compare-legend");
  if (legendBox && group) scale.legend(legendBox);
  const perJob = !scale.continuous && jobs.length <= COMPARE_LEGEND_MAX;
  const hover = document.getElementById("compare-hover");
  let plot = null;
  let log = false;
  const draw = async () => {
    const tables = await Promise.all(jobs.map(async (j) => {
      const s = await api("GET", `/jobs/${j.id}/series?key=${encodeURIComponent(metric)}&points=1000`);
      const b = s.series[metric] || { i: [], last: [] };
      return [b.i, b.last];
    }));
    const data = uPlot.join(tables);
    const series = [{ label: "step" }, ...jobs.map((j) => ({
      label: `job ${j.id}${group ? ` · ${group}=${valueText(j.value)}` : ""}`, stroke: colorOf(j), width: 1.5, spanGaps: true,
    }))];
    if (!plot) {
      const width = Math.max(320, Math.min(1000, box.clientWidth - 16));
      plot = new uPlot({
        width, height: 320, series, scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
        axes: [{}, { size: 60 }], cursor: { drag: { x: true, y: false }, focus: { prox: 16 } },
        legend: { show: perJob, live: true }, focus: { alpha: 0.3 },
        hooks: { setSeries: [(u, i) => { if (hover) hover.textContent = i ? u.series[i].label : ""; }] },
      }, data, box);
      box.dataset.jobs = String(jobs.length);
      box.dataset.legend = perJob ? "jobs" : scale.continuous ? "continuous" : "values";
    } else {
      plot.setData(data, true);
    }
    box.dataset.drawn = String((box.dataset.drawn | 0) + 1);
  };
  document.getElementById("logscale").addEventListener("change", (e) => {
    log = e.target.checked;
    if (plot) { plot.destroy(); plot = null; }
    draw();
  });
  draw();
  if (jobs.some((j) => !TERMINAL.has(j.state))) setInterval(draw, 3000);
}

if (kind === "jobs") jobsPage();
else if (kind === "compare") comparePage();
else if (kind === "job" && pageData.job) jobPage();
