// The Experiments pages: the list (rows refreshed as trials' jobs change) and an experiment's page (the
// trial table, sortable and filterable; parameter importance; best so far; parallel coordinates whose
// axes filter the table; one metric's curves of all trials; the scheduler's decisions), kept live
// over the experiment's event stream. The server rendered the first screen; this takes it over.
import { api, follow, jobEvents, notice } from "./page.js";
import { ParallelCoordinates, short } from "./parcoords.js";
import { colorScale, drawBest, drawCurves, drawDecisions, drawImportance, KIND_COLORS } from "./expcharts.js";

const main = document.getElementById("page");
const kind = main.dataset.kind;
const pageData = JSON.parse(main.dataset.page || "{}");
// The trial states, from the server (the experiment page's data): no copy of their names here.
const TRIAL_STATES = pageData.trial_states || [];
const ACTIVE = new Set(pageData.active_trial_states || []);
const PRUNED_AMONG = pageData.pruned_among; // the state whose count says how many of them were pruned

const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fmt = (v) => (v === null || v === undefined ? "" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)))) : String(v));

// Only the answer to the latest call of `fn` is used (an earlier, slower one is dropped).
function latest(fn) {
  let n = 0;
  return async (...args) => {
    const mine = ++n;
    const value = await fn(...args);
    return mine === n ? value : undefined;
  };
}

// `fn` at most once every `ms` (the last call's turn comes at the end of the interval).
function throttle(fn, ms) {
  let timer = null;
  let last = 0;
  return () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; last = Date.now(); fn(); }, Math.max(0, last + ms - Date.now()));
  };
}

function debounce(fn, ms) {
  let timer = null;
  return () => { clearTimeout(timer); timer = setTimeout(fn, ms); };
}

// -- the list ---------------------------------------------------------------------------------------
function listPage() {
  const refresh = debounce(async () => {
    const r = await fetch("/experiments/rows", { credentials: "same-origin" });
    if (r.ok) document.getElementById("experiments").innerHTML = await r.text();
  }, 500);
  const names = jobEvents("submitted", "running", "ended", "stopped", "tune_decision");
  follow("/events", Object.fromEntries(names.map((name) => [name, refresh])));
  setInterval(() => { if (document.querySelector("#experiments tr[data-live]")) refresh(); }, 3000);
}

// -- an experiment ----------------------------------------------------------------------------------
function experimentPage() {
  let exp = pageData.experiment;
  const params = pageData.params || [];
  const metric = exp.metric;
  const trials = new Map();
  const decisions = [];
  const sort = { key: "last", dir: exp.mode === "max" ? -1 : 1 };
  const body = document.getElementById("trials");
  const pc = new ParallelCoordinates(document.getElementById("parcoords"), { onBrush: () => renderTable() });
  let bestPlot = null;
  let curveData = null;

  const valueOf = (t, key) => {
    if (key.startsWith("config:")) return t.config[key.slice(7)];
    if (key === "reason") return t.reason?.text ?? "";
    return t[key];
  };
  const compare = (a, b) => {
    const [x, y] = [valueOf(a, sort.key), valueOf(b, sort.key)];
    if (x === y) return a.trial_id < b.trial_id ? -1 : 1;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * sort.dir;
  };
  const rowHtml = (t) => `<tr id="trial-${esc(t.trial_id)}" data-state="${t.state}"><td class=name>${esc(t.name)}</td>`
    + `<td><span class="tstate t-${t.state}">${t.state}</span></td><td class=reason>${esc(t.reason?.text ?? "")}</td>`
    + params.map((p) => `<td class=num>${esc(fmt(t.config[p]))}</td>`).join("")
    + `<td class=num>${esc(fmt(t.last))}</td><td class=num>${esc(fmt(t.best))}</td><td class=num>${t.iterations}</td>`
    + `<td>${t.job !== null ? `<a href="/jobs/${t.job}">${t.job}</a>` : ""}</td></tr>`;
  const filterText = document.getElementById("trial-filter");
  const stateBoxes = [...document.querySelectorAll(".state-filter")];
  const shownNow = (t) => {
    const states = new Set(stateBoxes.filter((b) => b.checked).map((b) => b.value));
    if (!states.has(t.state)) return false;
    const text = filterText.value.trim().toLowerCase();
    if (text && !`${t.name} ${t.trial_id} ${t.state} ${t.reason?.text ?? ""} ${Object.values(t.config).join(" ")}`.toLowerCase().includes(text)) return false;
    return pc.passes(t);
  };
  function renderTable() {
    const all = [...trials.values()];
    const rows = all.filter(shownNow).sort(compare);
    body.innerHTML = rows.map(rowHtml).join("") || `<tr class=empty><td colspan=${params.length + 7}>No trial matches.</td></tr>`;
    body.dataset.shown = String(rows.length);
    document.getElementById("shown").textContent = `${rows.length} of ${all.length} trials`;
    document.querySelectorAll("th[data-sort]").forEach((th) => {
      th.classList.toggle("sorted", th.dataset.sort === sort.key);
      th.classList.toggle("desc", th.dataset.sort === sort.key && sort.dir < 0);
    });
  }
  document.querySelectorAll("th[data-sort]").forEach((th) => th.addEventListener("click", () => {
    sort.dir = sort.key === th.dataset.sort ? -sort.dir : 1;
    sort.key = th.dataset.sort;
    renderTable();
  }));
  filterText.addEventListener("input", debounce(renderTable, 150));
  stateBoxes.forEach((b) => b.addEventListener("change", renderTable));

  // Parallel coordinates: each parameter, then the metric, coloured by the metric (viridis: dark = low).
  function drawParcoords() {
    const rows = [...trials.values()];
    // A parameter with one value in every trial (a fixed batch size, a seed) gets no axis: it sorts nothing.
    const constant = rows.length < 2 ? [] : params.filter((p) => new Set(rows.map((t) => JSON.stringify(t.config[p]))).size < 2);
    document.getElementById("parcoords-constant").textContent = constant.length
      ? `constant (no axis): ${constant.map((p) => `${p} = ${fmt(rows[0].config[p])}`).join(", ")}` : "";
    const dims = params.filter((p) => !constant.includes(p)).map((p) => {
      const values = rows.map((t) => t.config[p]).filter((v) => v !== undefined && v !== null);
      const spec = exp.space[p] || {};
      const numeric = values.length && values.every((v) => typeof v === "number")
        && (spec.kind !== "categorical" || (spec.choices || []).every((c) => typeof c === "number"));
      const type = !numeric ? "cat" : spec.log ? "log" : "linear"; // numeric choices (a grid) get a numeric axis
      const choices = spec.kind === "categorical" && spec.choices ? [...new Set(spec.choices.map(String))] : undefined;
      return { key: p, label: p, type, low: spec.low ?? undefined, high: spec.high ?? undefined,
        categories: type === "cat" ? choices : undefined, get: (t) => t.config[p] };
    });
    if (metric) dims.push({ key: "__metric", label: metric, type: "linear", get: (t) => t.last });
    const scale = colorScale(rows.map((t) => t.last), { continuous: true });
    pc.setData(dims, rows, (t) => (t.last === null ? "#9ca3af" : scale.color(t.last)));
  }

  const importanceOf = latest((evaluator) => api("GET", `/experiments/${exp.id}/importance?evaluator=${evaluator}`));
  async function loadImportance() {
    const evaluator = document.getElementById("evaluator").value;
    const box = document.getElementById("importance");
    const meta = document.getElementById("importance-meta");
    try {
      const imp = await importanceOf(evaluator);
      if (!imp) return; // a later request answers
      if (Object.keys(imp.importances).length) drawImportance(box, imp.importances, imp.intervals);
      else box.innerHTML = `<p class=empty>${esc(imp.notes.find((n) => !n.startsWith("constant:")) || imp.notes[0]
        || "Not enough finished trials yet.")}</p>`;
      const warning = document.getElementById("importance-warning");
      warning.textContent = imp.warning || "";
      warning.hidden = !imp.warning;
      const constant = new Set(imp.constant);
      const skipped = Object.entries(imp.skipped).filter(([k]) => !constant.has(k)).map(([k, why]) => `${k} (${why})`);
      const stable = imp.stability === null ? ""
        : `; the top parameter stays top in ${Math.round(100 * imp.stability)}% of ${imp.resamples} resamples `
          + "(bars: 10-90% of them)";
      meta.textContent = `${imp.evaluator === "fanova" ? "fANOVA" : "PED-ANOVA"} over ${imp.trials} completed trial(s)`
        + stable + (imp.constant.length ? `; constant: ${imp.constant.join(", ")}` : "")
        + `${skipped.length ? `; left out: ${skipped.join("; ")}` : ""}`
        + `${imp.cached ? "" : `; computed in ${imp.computed_ms.toFixed(0)} ms`}`;
      box.dataset.trials = String(imp.trials);
    } catch (err) {
      box.innerHTML = `<p class=empty>${esc(err.message)}</p>`;
    }
  }
  document.getElementById("evaluator").addEventListener("change", loadImportance);

  const historyOf = latest(() => api("GET", `/experiments/${exp.id}/history`));
  async function loadHistory() {
    const h = await historyOf();
    if (!h) return;
    const box = document.getElementById("bestchart");
    if (!h.points.length) { box.innerHTML = "<p class=empty>No finished trial yet.</p>"; bestPlot = null; return; }
    bestPlot = drawBest(box, h.points, document.getElementById("best-x").value, bestPlot);
  }
  document.getElementById("best-x").addEventListener("change", () => { if (bestPlot) { bestPlot.destroy(); bestPlot = null; } loadHistory(); });

  // Curves of one metric, coloured by a parameter (or the trial's state).
  const metricSelect = document.getElementById("curve-metric");
  const colorSelect = document.getElementById("curve-color");
  const xSelect = document.getElementById("curve-x");
  colorSelect.innerHTML = [...params, "state"].map((p) => `<option>${esc(p)}</option>`).join("");
  function drawCurveData() {
    if (!curveData) return;
    const by = colorSelect.value;
    const ids = Object.keys(curveData.trials);
    const valueFor = (id) => (by === "state" ? curveData.trials[id].state : trials.get(id)?.config[by]);
    const scale = colorScale(ids.map(valueFor), { log: !!exp.space[by]?.log });
    const useT = xSelect.value === "t";
    const series = Object.fromEntries(ids.map((id) => {
      const c = curveData.trials[id];
      return [id, { x: useT ? c.t : c.i, y: c.v, state: c.state, pruned: c.pruned }];
    }));
    drawCurves(document.getElementById("curves"), series, (id) => scale.color(valueFor(id)), { xLabel: useT ? "seconds" : "iteration" });
    scale.legend(document.getElementById("curve-legend"));
  }
  const curvesOf = latest((chosen) => api("GET", `/experiments/${exp.id}/curves?points=200${chosen ? `&metric=${encodeURIComponent(chosen)}` : ""}`));
  async function loadCurves() {
    const got = await curvesOf(metricSelect.value || metric || "");
    if (!got) return;
    curveData = got;
    if (metricSelect.options.length !== curveData.metrics.length) {
      metricSelect.innerHTML = curveData.metrics.map((m) => `<option${m === curveData.metric ? " selected" : ""}>${esc(m)}</option>`).join("");
    }
    drawCurveData();
  }
  metricSelect.addEventListener("change", loadCurves);
  colorSelect.addEventListener("change", drawCurveData);
  xSelect.addEventListener("change", drawCurveData);

  function renderDecisions() {
    const t0 = exp.started_at || (decisions[0]?.ts ?? 0);
    drawDecisions(document.getElementById("decision-chart"), decisions, t0);
    document.getElementById("decisions").innerHTML = decisions.slice().reverse().map((d) => `<tr data-kind="${esc(d.kind)}">`
      + `<td>+${short(d.ts - t0)}s</td><td>${esc(d.trial_id)}</td>`
      + `<td><span class=kind-dot data-kind="${esc(d.kind)}"></span>${esc(d.kind)}</td><td class=num>${d.iteration ?? ""}</td>`
      + `<td>${esc(d.detail.text || "")}</td></tr>`).join("") || "<tr class=empty><td colspan=5>None yet.</td></tr>";
    document.querySelectorAll(".kind-dot").forEach((dot) => { dot.style.background = KIND_COLORS[dot.dataset.kind] || "#374151"; });
  }

  function renderSummary() {
    document.getElementById("ntrials").textContent = String(exp.trials);
    const b = exp.best;
    document.getElementById("best").innerHTML = b ? ` · best ${esc(metric)} <b>${esc(fmt(b.value))}</b> (trial ${esc(b.trial_id)}`
      + `${b.job !== null ? `, <a href="/jobs/${b.job}">job ${b.job}</a>` : ""})` : "";
    document.getElementById("counts").innerHTML = TRIAL_STATES.filter((s) => exp.counts[s])
      .map((s) => `<span class="tstate t-${s}">${exp.counts[s]} ${s}${s === PRUNED_AMONG && exp.pruned ? ` (${exp.pruned} pruned)` : ""}</span>`).join(" ");
  }

  const ended = debounce(() => { loadImportance(); loadHistory(); drawParcoords(); loadCurves(); }, 800);
  const redraw = throttle(() => { drawParcoords(); renderTable(); }, 1000);

  function onTrial(t) {
    const before = trials.get(t.trial_id);
    trials.set(t.trial_id, t);
    const row = document.getElementById(`trial-${t.trial_id}`);
    if (row && shownNow(t)) { // the row in place at once; the order and the charts a moment later
      const template = document.createElement("template");
      template.innerHTML = rowHtml(t);
      row.replaceWith(template.content.firstElementChild);
    }
    redraw();
    if (!ACTIVE.has(t.state) && (!before || ACTIVE.has(before.state))) ended();
  }

  let following = null;
  function followExperiment(after) {
    const source = follow(`/experiments/${exp.id}/stream?after=${after}`, {
      trial: (t) => onTrial(t),
      decision: (d) => { decisions.push(d); renderDecisions(); },
      experiment: (e) => { exp = e; renderSummary(); },
      idle: (e, ev) => { // no trial is queued or runs: wait for a job to be submitted
        source.close();
        following = null;
        exp = e;
        renderSummary();
        ended();
        if (exp.source === "server") waitForJobs(Number(ev.lastEventId));
      },
    });
    following = source;
  }
  // While no trial runs, the server's lifecycle events: a job submitted or started may be a new trial.
  function waitForJobs(rev) {
    const check = debounce(async () => {
      try {
        const e = await api("GET", `/experiments/${exp.id}`);
        if (e.live && !following) { jobs.close(); followExperiment(rev); }
      } catch (_) { /* the server is away: the next event tries again */ }
    }, 100);
    const jobs = follow("/events", Object.fromEntries(jobEvents("submitted", "starting", "running").map((n) => [n, check])));
  }
  setInterval(() => { if (following) loadCurves(); }, 3000); // running trials' curves grow

  document.getElementById("register").addEventListener("click", async () => {
    const best = exp.best;
    if (!best) { notice("No trial has a value of the metric yet: nothing to register.", true); return; }
    const name = window.prompt(`Register trial ${best.trial_id} (${metric} ${fmt(best.value)}) as a version of the model named:`, exp.name.replace(/[^A-Za-z0-9._-]/g, "-"));
    if (!name) return;
    const payload = best.job !== null ? { job: best.job } : { source: best.checkpoint };
    if (best.job === null && !best.checkpoint) { notice(`trial ${best.trial_id} left no checkpoint to register`, true); return; }
    try {
      const v = await api("POST", `/models/${encodeURIComponent(name)}/versions`, { ...payload,
        ...(metric ? { metrics: { [metric]: best.value } } : {}), tags: { experiment: exp.name, trial: best.trial_id } });
      notice(`registered ${v.uri}`);
      document.getElementById("register").dataset.registered = v.uri;
    } catch (err) {
      notice(`could not register trial ${best.trial_id}: ${err.message}`, true);
    }
  });

  (async () => {
    const listed = await api("GET", `/experiments/${exp.id}/trials`);
    exp = listed.experiment;
    for (const t of listed.trials) trials.set(t.trial_id, t);
    renderTable();
    renderSummary();
    drawParcoords();
    decisions.push(...await api("GET", `/experiments/${exp.id}/decisions`));
    renderDecisions();
    followExperiment(listed.rev);
    await Promise.all([loadImportance(), loadHistory(), loadCurves()]);
    main.dataset.ready = "1";
  })().catch((err) => notice(`experiment ${exp.id}: ${err.message}`, true));
}

if (kind === "experiments") listPage();
else if (kind === "experiment") experimentPage();
