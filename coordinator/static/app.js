// gradwire live page: the jobs table (polled) and one job's charts (server-sent events).
// Plain SVG, no libraries, no CDN. With GRADWIRE_TOKEN set, open the page as /#token=<token>.
"use strict";

const PHASES = ["data", "forward", "backward", "exposed_comm", "optimizer"];
const HOOK_PHASES = ["compress", "communicate", "decompress"];
const COLORS = { data: "#94a3b8", forward: "#60a5fa", backward: "#2563eb", exposed_comm: "#f97316",
                 optimizer: "#22c55e" };
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const MAX_POINTS = 600;

const $ = (sel) => document.querySelector(sel);
const svgNS = "http://www.w3.org/2000/svg";

// ---- auth -------------------------------------------------------------------------------
const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
if (hashToken) sessionStorage.setItem("gradwire-token", hashToken);
const token = sessionStorage.getItem("gradwire-token");
const authHeaders = token ? { Authorization: `Bearer ${token}` } : {};

async function getJSON(path) {
  const response = await fetch(path, { headers: authHeaders });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

// ---- formatting -------------------------------------------------------------------------
const fmt = (x, digits = 3) =>
  x === null || x === undefined ? "–" : String(Number(Number(x).toPrecision(digits)));
const gbps = (bytesPerSecond) => (bytesPerSecond ? `${fmt((bytesPerSecond * 8) / 1e9)} Gb/s` : "–");
const compressorLabel = (c, rank, ratio) =>
  c ? c + (rank ? ` r${rank}` : "") + (ratio ? ` ${ratio}` : "") : "–";

// ---- state ------------------------------------------------------------------------------
let selected = new URLSearchParams(location.search).get("job");
let stream = null;
let view = null; // {job, points, decisions}

// ---- jobs table -------------------------------------------------------------------------
async function refreshJobs() {
  let jobs;
  try {
    jobs = await getJSON("v1/jobs");
    $("#conn").textContent = "live";
  } catch (err) {
    $("#conn").textContent = `offline (${err.message})`;
    return;
  }
  $("#no-jobs").hidden = jobs.length > 0;
  const body = $("#jobs tbody");
  body.replaceChildren(...jobs.map(jobRow));
  if (!selected && jobs.length) {
    selected = (jobs.find((j) => j.state === "running") || jobs[0]).id;
  }
  if (selected && (!view || view.job.id !== selected)) openJob(selected);
  else if (view) markSelected();
}

function jobRow(job) {
  const tr = document.createElement("tr");
  tr.dataset.id = job.id;
  const cells = [job.id, job.name, job.state, `${job.step}/${job.steps ?? "?"}`, fmt(job.loss),
                 compressorLabel(job.compressor, job.compressor_rank, job.ratio), gbps(job.bandwidth_bytes_per_second)];
  cells.forEach((text, i) => {
    const td = document.createElement("td");
    td.textContent = text;
    if (i === 2) td.className = `state state-${job.state}`;
    tr.appendChild(td);
  });
  tr.addEventListener("click", () => { selected = job.id; openJob(job.id); });
  return tr;
}

function markSelected() {
  document.querySelectorAll("#jobs tbody tr").forEach((tr) =>
    tr.classList.toggle("selected", tr.dataset.id === selected));
}

// ---- one job: event stream --------------------------------------------------------------
function openJob(id) {
  if (stream) stream.close();
  view = { job: { id }, points: [], decisions: [], groups: [] };
  markSelected();
  const url = `v1/jobs/${id}/events` + (token ? `?access_token=${encodeURIComponent(token)}` : "");
  stream = new EventSource(url);
  stream.addEventListener("snapshot", (e) => {
    const h = JSON.parse(e.data);
    view = { job: h.job, points: h.telemetry, decisions: h.decisions, groups: h.worker_groups || [] };
    render();
  });
  stream.addEventListener("telemetry", (e) => {
    const { job, point } = JSON.parse(e.data);
    view.job = job;
    const last = view.points[view.points.length - 1];
    if (point && (!last || point.at > last.at)) view.points.push(point);
    if (view.points.length > MAX_POINTS) view.points.splice(0, view.points.length - MAX_POINTS);
    render();
  });
  stream.addEventListener("decision", (e) => {
    const d = JSON.parse(e.data);
    if (!view.decisions.some((x) => x.version === d.version)) view.decisions.push(d);
    render();
  });
  stream.addEventListener("workers", (e) => { view.groups.push(JSON.parse(e.data)); render(); });
  stream.addEventListener("state", (e) => { view.job.state = JSON.parse(e.data).to_state; render(); });
  stream.addEventListener("policy", (e) => { view.job.policy_mode = JSON.parse(e.data).mode; render(); });
  stream.addEventListener("end", (e) => { view.job = JSON.parse(e.data); stream.close(); render(); });
}

function render() {
  const job = view.job;
  if (!job.name) return;
  $("#job").hidden = false;
  $("#job-title").textContent = `${job.name} (${job.id})`;
  const step = job.step_seconds;
  const facts = [
    ["state", job.state], ["step", `${job.step} / ${job.steps ?? "?"}`], ["loss", fmt(job.loss, 4)],
    ["compressor", compressorLabel(job.compressor, job.compressor_rank, job.ratio)],
    ["bandwidth", gbps(job.bandwidth_bytes_per_second)],
    ["latency", job.latency_seconds ? `${fmt(job.latency_seconds * 1e3)} ms` : "–"],
    ["samples/s", fmt(job.samples_per_second)], ["step time", step ? `${fmt(step * 1e3)} ms` : "–"],
    ["policy", job.policy_mode], ["decision", `v${job.decision_version}`],
    ["workers", job.world_size ?? job.workers], ["restarts", restartsLabel(view.groups)], ["reason", job.reason],
  ];
  $("#job-facts").replaceChildren(...facts.flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v ?? "–";
    if (k === "state") dd.className = `state state-${v}`;
    return [dt, dd];
  }));
  drawPhases($("#chart-phases"), view.points);
  drawLine($("#chart-bandwidth"), view.points, (p) => p.bandwidth_bytes_per_second &&
           (p.bandwidth_bytes_per_second * 8) / 1e9, "#0ea5e9");
  drawRank($("#chart-rank"), view.points);
  drawLine($("#chart-loss"), view.points, (p) => p.loss, "#a855f7");
  renderLegend(view.points[view.points.length - 1]);
  renderDecisions(view.decisions);
}

// Worker-group restarts (Ray Train restarted the group after a crash), newest last.
function restartsLabel(groups) {
  const restarts = groups.filter((g) => g.restart);
  if (!restarts.length) return "0";
  const last = restarts[restarts.length - 1];
  const from = last.resumed_from_step === null || last.resumed_from_step === undefined
    ? "step 0" : `checkpoint at step ${last.resumed_from_step}`;
  return `${restarts.length} (last: resumed from ${from}, was at step ${last.last_reported_step})`;
}

function renderLegend(point) {
  const items = PHASES.map((phase) => {
    const span = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = COLORS[phase];
    const ms = point && point.phase_seconds[phase] !== undefined ? ` ${fmt(point.phase_seconds[phase] * 1e3)} ms` : "";
    span.append(swatch, phase + ms);
    return span;
  });
  const hook = point ? HOOK_PHASES.filter((p) => p in point.phase_seconds)
    .map((p) => `${p} ${fmt(point.phase_seconds[p] * 1e3)} ms`).join(", ") : "";
  if (hook) {
    const span = document.createElement("span");
    span.className = "muted";
    span.textContent = `in the hook: ${hook}`;
    items.push(span);
  }
  $("#legend-phases").replaceChildren(...items);
}

function renderDecisions(decisions) {
  $("#decisions tbody").replaceChildren(...[...decisions].reverse().map((d) => {
    const tr = document.createElement("tr");
    const gain = d.predicted_gain === null || d.predicted_gain === undefined ? "–" : `${fmt(d.predicted_gain * 100)} %`;
    [`v${d.version}`, d.compressor, JSON.stringify(d.params), d.source, gain, d.reason].forEach((text) => {
      const td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
    });
    return tr;
  }));
}

// ---- SVG charts -------------------------------------------------------------------------
const W = 480, H = 200, PAD = { left: 44, right: 8, top: 8, bottom: 22 };

function el(name, attrs, text) {
  const node = document.createElementNS(svgNS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function frame(svg, xMin, xMax, yMax, yLabel = (y) => fmt(y)) {
  svg.replaceChildren();
  const x = (v) => PAD.left + ((v - xMin) / Math.max(xMax - xMin, 1e-9)) * (W - PAD.left - PAD.right);
  const y = (v) => H - PAD.bottom - (v / Math.max(yMax, 1e-12)) * (H - PAD.top - PAD.bottom);
  svg.append(el("line", { x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom, stroke: "#cbd5e1" }),
             el("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom, stroke: "#cbd5e1" }),
             el("text", { x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, yLabel(yMax)),
             el("text", { x: PAD.left - 4, y: H - PAD.bottom, "text-anchor": "end" }, "0"),
             el("text", { x: PAD.left, y: H - 6 }, `step ${xMin}`),
             el("text", { x: W - PAD.right, y: H - 6, "text-anchor": "end" }, `step ${xMax}`));
  return { x, y };
}

function empty(svg) {
  svg.replaceChildren(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "waiting for telemetry"));
}

function drawLine(svg, points, value, color) {
  const data = points.map((p) => [p.step, value(p)]).filter(([, v]) => v !== null && v !== undefined && isFinite(v));
  if (!data.length) return empty(svg);
  const { x, y } = frame(svg, data[0][0], data[data.length - 1][0], Math.max(...data.map(([, v]) => v)) * 1.1);
  const d = data.map(([s, v], i) => `${i ? "L" : "M"}${x(s).toFixed(1)},${y(v).toFixed(1)}`).join("");
  svg.append(el("path", { d, fill: "none", stroke: color, "stroke-width": 2 }));
  const [ls, lv] = data[data.length - 1];
  svg.append(el("circle", { cx: x(ls), cy: y(lv), r: 3, fill: color }));
}

function drawPhases(svg, points) {
  const data = points.filter((p) => PHASES.some((ph) => p.phase_seconds[ph] !== undefined));
  if (!data.length) return empty(svg);
  const total = (p) => PHASES.reduce((s, ph) => s + (p.phase_seconds[ph] || 0), 0) * 1e3;
  const first = data[0].step, last = data[data.length - 1].step;
  const { x, y } = frame(svg, first, last, Math.max(...data.map(total)) * 1.1);
  // Bars as wide as the closest pair of reports allows, centred on their step, kept inside the plot.
  const xs = data.map((p) => x(p.step));
  const gaps = xs.slice(1).map((v, i) => v - xs[i]).filter((g) => g > 0);
  const barW = Math.max(2, Math.min(40, (gaps.length ? Math.min(...gaps) : 40) * 0.8));
  data.forEach((p, i) => {
    let base = 0;
    const left = Math.min(Math.max(PAD.left, xs[i] - barW / 2), W - PAD.right - barW);
    for (const ph of PHASES) {
      const ms = (p.phase_seconds[ph] || 0) * 1e3;
      if (ms <= 0) continue;
      svg.append(el("rect", { x: left.toFixed(1), y: y(base + ms).toFixed(1), width: barW.toFixed(1),
                              height: Math.max(0.5, y(base) - y(base + ms)).toFixed(1), fill: COLORS[ph] }));
      base += ms;
    }
  });
}

function drawRank(svg, points) {
  const data = points.filter((p) => p.compressor);
  if (!data.length) return empty(svg);
  const rankOf = (p) => p.compressor_rank || 0;
  const { x, y } = frame(svg, data[0].step, data[data.length - 1].step,
                         Math.max(1, ...data.map(rankOf)) * 1.2, (v) => `r${Math.round(v)}`);
  let d = "";
  data.forEach((p, i) => {
    d += i ? `H${x(p.step).toFixed(1)}V${y(rankOf(p)).toFixed(1)}` : `M${x(p.step).toFixed(1)},${y(rankOf(p)).toFixed(1)}`;
  });
  svg.append(el("path", { d, fill: "none", stroke: "#0f766e", "stroke-width": 2 }));
  let previous = null;
  data.forEach((p) => {
    const label = compressorLabel(p.compressor, p.compressor_rank, p.ratio);
    if (label !== previous) {
      const nearRight = x(p.step) > W - 80;
      svg.append(el("text", { x: x(p.step) + (nearRight ? -2 : 2), y: Math.max(PAD.top + 10, y(rankOf(p)) - 4),
                              "text-anchor": nearRight ? "end" : "start", class: "switch" }, label));
      previous = label;
    }
  });
}

// ---- start ------------------------------------------------------------------------------
refreshJobs();
setInterval(refreshJobs, 2000);
