// Quorum's dashboard: one page over the REST API (/api/v1), with the caller's token. Every
// string from the cluster (job names, users, reasons) is put in the page as text, never as
// markup: a job's name is its owner's to choose.
"use strict";

const REFRESH_MS = 2000;
let token = sessionStorage.getItem("quorum-token") || "";
let timer = null;
let selected = null; // the job whose panel is open
let logTail = { job: null, offset: 0, timer: null };

// A new element: el("td", {class: "x"}, "text", child, ...).
function el(tag, attrs, ...children) {
  const svg = ["svg", "rect", "line", "text", "g", "title"].includes(tag);
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : "HTTP " + status);
    this.status = status;
  }
}

async function api(path, method) {
  const r = await fetch("/api/v1" + path, { method: method || "GET", headers: { Authorization: "Bearer " + token } });
  let body = null;
  try { body = await r.json(); } catch (_) { /* no JSON body */ }
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

function when(ms) {
  if (!ms) return "";
  const d = new Date(Number(ms));
  return d.toISOString().replace("T", " ").slice(0, 19);
}

function duration(s) {
  s = Number(s) || 0;
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return (h ? h + ":" : "") + String(m).padStart(h ? 2 : 1, "0") + ":" + String(sec).padStart(2, "0");
}

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes);
}

function failed(e) {
  if (e instanceof ApiError && e.status === 401) return signIn(e.message);
  show(el("p", { class: "error", id: "error" }, e.message));
}

// ---- views ----

async function clusterView() {
  const c = await api("/cluster");
  const rows = c.members.map((m) => {
    const s = m.status || {};
    return el("tr", { class: s.role === "leader" ? "leader" : "" },
      el("td", {}, m.id), el("td", {}, m.address), el("td", {}, s.role || "unreachable"),
      el("td", {}, s.term ?? ""), el("td", {}, s.committed_index ?? ""), el("td", {}, s.applied_index ?? ""),
      el("td", {}, s.snapshot_index ?? ""), el("td", {}, s.version || ""), el("td", {}, s.feature_level ?? ""),
      el("td", {}, when(s.started_at_ms)), el("td", { class: "error" }, m.error || ""));
  });
  show(el("h2", {}, "Replicas"),
    el("table", { id: "replicas" },
      el("tr", {}, ["id", "address", "role", "term", "committed", "applied", "snapshot", "version", "level", "started", ""].map((h) => el("th", {}, h))),
      rows),
    el("p", {}, "Answered by replica " + c.answered_by));
}

async function nodesView() {
  const [n, plan] = await Promise.all([api("/nodes"), api("/plan")]);
  const running = {};
  for (const j of plan.jobs.filter((j) => j.state === "RUNNING")) {
    for (const node of j.nodes) (running[node] = running[node] || []).push(j.id);
  }
  const rows = n.nodes.map((node) => el("tr", {},
    el("td", {}, node.name), el("td", { class: "state-" + node.state }, node.state), el("td", {}, node.reason),
    el("td", {}, node.alloc_cpus + "/" + node.cpus), el("td", {}, node.alloc_mem_mb + "/" + node.mem_mb + " MB"),
    el("td", {}, node.gpus ? node.alloc_gpus + "/" + node.gpus + " " + node.gpu_types : ""),
    el("td", {}, (node.gpu_health || []).map((g) => el("span", { class: "gpu " + g.state, title: "GPU " + g.index + ": " + g.state + (g.detail ? " (" + g.detail + ")" : "") }))),
    el("td", {}, (running[node.name] || []).map((id) => el("a", { href: "#/job/" + id }, id, " "))),
    el("td", {}, node.connected ? node.agent_version : "not connected")));
  show(el("h2", {}, "Nodes"),
    el("table", { id: "nodes" },
      el("tr", {}, ["node", "state", "reason", "CPUs", "memory", "GPUs", "GPU health", "jobs", "agent"].map((h) => el("th", {}, h))),
      rows));
}

const queueFilter = { user: "", partition: "", state: "PENDING,RUNNING" };

async function queueView() {
  const q = new URLSearchParams();
  if (queueFilter.state) q.set("state", queueFilter.state);
  if (queueFilter.user) q.set("user", queueFilter.user);
  const [page, prio] = await Promise.all([api("/jobs?" + q), api("/priorities").catch(() => ({ jobs: [] }))]);
  const priority = {};
  for (const p of prio.jobs) priority[p.job_id] = p.total;
  const jobs = page.jobs.filter((j) => !queueFilter.partition || j.partition === queueFilter.partition);
  // Slurm's order (squeue's -S P,t,-p): by partition, pending before running (its states'
  // order), highest priority first; held jobs count as 0, as squeue shows them.
  const stateOrder = ["PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"];
  const rank = (j) => { const r = stateOrder.indexOf(j.state); return r < 0 ? stateOrder.length : r; };
  const prioOf = (j) => (j.held ? 0 : priority[j.id] || 0);
  jobs.sort((a, b) => (a.partition < b.partition ? -1 : a.partition > b.partition ? 1 : 0)
    || rank(a) - rank(b) || prioOf(b) - prioOf(a) || Number(a.id) - Number(b.id));
  const input = (name, placeholder) => el("input", { id: "filter-" + name, value: queueFilter[name], placeholder,
    onchange: (e) => { queueFilter[name] = e.target.value.trim(); render(); } });
  const states = ["PENDING,RUNNING", "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", ""];
  const stateSelect = el("select", { id: "filter-state", onchange: (e) => { queueFilter.state = e.target.value; render(); } },
    states.map((s) => el("option", s === queueFilter.state ? { value: s, selected: "" } : { value: s }, s || "any state")));
  const rows = jobs.map((j) => el("tr", { "data-job": j.id },
    el("td", {}, el("a", { href: "#/job/" + j.id }, j.id)), el("td", {}, j.name), el("td", {}, j.user),
    el("td", {}, j.partition), el("td", { class: "state-" + j.state }, j.state),
    // A running job the GPU idle policy flagged says since when its GPUs have been idle.
    j.state === "RUNNING" && j.gpu_idle_since_ms > 0
      ? el("td", { class: "gpu-idle" }, "GPUs idle since " + when(j.gpu_idle_since_ms))
      : el("td", {}, j.reason),
    el("td", {}, priority[j.id] !== undefined ? priority[j.id].toFixed(0) : ""),
    el("td", j.expected_forecast ? { class: "forecast", title: "a forecast on predicted run times, not a reservation" } : {},
      j.state === "RUNNING" ? when(j.start_time_ms) : when(j.expected_start_ms) + (j.expected_forecast ? " (forecast)" : "")),
    el("td", {}, j.state === "RUNNING" ? j.nodelist : j.expected_nodes), el("td", {}, duration(j.time_limit_s))));
  show(el("h2", {}, "Queue"),
    el("div", { class: "filters" }, input("user", "user"), input("partition", "partition"), stateSelect),
    el("table", { id: "queue" },
      el("tr", {}, ["job", "name", "user", "partition", "state", "reason", "priority", "start (expected)", "nodes", "limit"].map((h) => el("th", {}, h))),
      rows));
}

// The plan: nodes across, time upward from now; running jobs from now to their time limit,
// reserved ones from where backfill expects them to start; what is left blank is free.
async function planView() {
  const plan = await api("/plan");
  const now = Number(plan.now_ms);
  const placed = plan.jobs.filter((j) => j.nodes.length && j.end_ms);
  const resvs = plan.reservations || [];
  // A reservation without an end is drawn to the top of the chart.
  const last = Math.max(now + 10 * 60 * 1000, ...placed.map((j) => Number(j.end_ms)),
    ...resvs.filter((r) => Number(r.end_ms)).map((r) => Number(r.end_ms)));
  const column = {};
  plan.nodes.forEach((n, i) => { column[n.name] = i; });
  const colW = Math.max(6, Math.min(48, Math.floor(1200 / Math.max(1, plan.nodes.length))));
  const left = 70, bottom = 40, height = 520, top = 10;
  const width = left + colW * plan.nodes.length + 10;
  const perMs = height / (last - now);
  const y = (ms) => top + height - (Math.max(ms, now) - now) * perMs;
  const svg = el("svg", { id: "plan", width, height: top + height + bottom, "data-now": now, "data-top": top, "data-height": height, "data-last": last });
  // Time axis: a line every step, labelled by how far from now.
  const axis = el("g", { class: "axis" });
  const spanMin = (last - now) / 60000;
  const step = [1, 5, 10, 15, 30, 60, 120, 240, 720, 1440].find((s) => spanMin / s <= 10) || 2880;
  for (let m = 0; m <= spanMin; m += step) {
    const yy = y(now + m * 60000);
    axis.append(el("line", { x1: left - 4, x2: width, y1: yy, y2: yy }),
      el("text", { x: 4, y: yy + 3 }, m === 0 ? "now" : "+" + (m >= 60 ? (m / 60) + " h" : m + " min")));
  }
  svg.append(axis);
  const names = el("g", { class: "nodes" });
  plan.nodes.forEach((n, i) => {
    if (colW >= 14 || i % Math.ceil(14 / colW) === 0) {
      names.append(el("text", { x: left + i * colW + 2, y: top + height + 14, transform: `rotate(45 ${left + i * colW + 2} ${top + height + 14})` }, n.name));
    }
  });
  svg.append(names);
  const held = el("g", { class: "reservations" });
  for (const r of resvs) {
    const y0 = y(Number(r.start_ms)), y1 = Number(r.end_ms) ? y(Math.min(Number(r.end_ms), last)) : top;
    const maint = r.flags.includes("MAINT");
    for (const node of r.nodes) {
      if (column[node] === undefined) continue;
      held.append(el("rect", {
        class: "resv" + (maint ? " maint" : ""), x: left + column[node] * colW, width: colW, y: y1, height: Math.max(1, y0 - y1),
        "data-resv": r.name, "data-node": node, "data-start": r.start_ms, "data-end": r.end_ms,
      }, el("title", {}, `reservation ${r.name}${maint ? " (maintenance)" : ""} for ${[...r.users, ...r.accounts].join(", ")}: ${when(r.start_ms)} – ${Number(r.end_ms) ? when(r.end_ms) : "no end"}`)));
    }
  }
  svg.append(held);
  const jobs = el("g", { class: "jobs" });
  for (const j of placed) {
    const y0 = y(Number(j.start_ms)), y1 = y(Number(j.end_ms));
    for (const node of j.nodes) {
      if (column[node] === undefined) continue;
      const r = el("rect", {
        class: "job " + (j.state === "RUNNING" ? "running" : "pending") + (selected === j.id ? " selected" : ""),
        x: left + column[node] * colW, width: colW, y: y1, height: Math.max(1, y0 - y1),
        "data-job": j.id, "data-node": node, "data-start": j.start_ms, "data-end": j.end_ms,
        onclick: () => openJob(j.id),
      }, el("title", {}, `${j.id} ${j.name} (${j.user}) ${j.state} ${when(j.start_ms)} – ${when(j.end_ms)}`));
      jobs.append(r);
    }
  }
  svg.append(jobs);
  svg.append(el("g", { class: "now" }, el("line", { x1: left, x2: width, y1: y(now), y2: y(now) })));
  const waiting = plan.jobs.filter((j) => j.state === "PENDING" && !j.nodes.length).length;
  show(el("h2", {}, "Plan"),
    el("p", { class: "legend" }, el("span", {}, el("i", { class: "run" }), "running, to its time limit"),
      el("span", {}, el("i", { class: "pend" }), "reserved by backfill"),
      el("span", {}, el("i", { class: "resv" }), "advance reservation (darker: maintenance)"),
      el("span", {}, waiting + " pending without a place yet"), el("span", {}, "updated " + when(now))),
    el("div", { id: "plan-chart" }, svg));
}

// ---- a job ----

async function jobDetails(id) {
  const { job } = await api("/jobs/" + id);
  const spec = job.spec || {};
  const usage = job.usage;
  const cancel = el("button", { class: "danger", id: "cancel-job", onclick: async (e) => {
    const b = e.target;
    if (b.dataset.armed !== "1") { b.dataset.armed = "1"; b.textContent = "Really cancel job " + id + "?"; return; }
    try { await api("/jobs/" + id + "/cancel", "POST"); b.textContent = "Cancelled"; b.disabled = true; }
    catch (err) { b.replaceWith(el("span", { class: "error" }, err.message)); }
  } }, "Cancel job");
  const steps = (job.steps || []).map((s) => el("tr", {}, el("td", {}, s.id), el("td", {}, s.name), el("td", { class: "state-" + s.state }, s.state),
    el("td", {}, s.nodelist), el("td", {}, s.ntasks), el("td", {}, s.has_exit_code ? s.exit_code : "")));
  const log = el("pre", { class: "log", id: "job-log" });
  const finished = !["PENDING", "RUNNING"].includes(job.state);
  return el("div", { id: "job", "data-job": job.id },
    el("h2", {}, "Job " + job.id + " ", el("span", { class: "state-" + job.state, id: "job-state" }, job.state)),
    el("dl", {},
      el("dt", {}, "name"), el("dd", {}, job.name), el("dt", {}, "user"), el("dd", {}, job.user),
      el("dt", {}, "account / qos"), el("dd", {}, job.account + " / " + job.qos),
      el("dt", {}, "partition"), el("dd", {}, job.partition), el("dt", {}, "reason"), el("dd", {}, job.reason),
      el("dt", {}, "submitted"), el("dd", {}, when(job.submit_time_ms)),
      el("dt", {}, job.start_time_ms ? "started" : "expected start"), el("dd", {}, when(job.start_time_ms || job.expected_start_ms)),
      el("dt", {}, "ended"), el("dd", {}, when(job.end_time_ms)),
      el("dt", {}, "time limit"), el("dd", {}, duration(job.time_limit_s)),
      el("dt", {}, "nodes"), el("dd", {}, job.nodelist || job.expected_nodes),
      el("dt", {}, "asks"), el("dd", {}, `${spec.nodes} node(s), ${spec.ntasks} task(s) × ${spec.cpus_per_task} CPU(s)` + (spec.gpus_per_node ? `, ${spec.gpus_per_node} GPU(s)/node` : "")),
      el("dt", {}, "command"), el("dd", {}, (spec.argv || []).join(" ") || (spec.script || "").split("\n")[0]),
      el("dt", {}, "exit"), el("dd", {}, job.has_exit_code ? job.exit_code + (job.signal ? " (signal " + job.signal + ")" : "") : ""),
      el("dt", {}, "used"), el("dd", {}, usage ? `${((Number(usage.cpu_user_us) + Number(usage.cpu_system_us)) / 1e6).toFixed(1)} CPU s, max RSS ${Math.round(usage.max_rss_kb / 1024)} MB` : "")),
    finished ? null : cancel,
    steps.length ? el("div", {}, el("h3", {}, "Steps"), el("table", {}, el("tr", {}, ["step", "name", "state", "nodes", "tasks", "exit"].map((h) => el("th", {}, h))), steps)) : null,
    job.start_time_ms ? el("div", {}, el("h3", {}, "Output"), log) : null);
}

// Follows a job's output: what is new every refresh, until the job has ended and all is read.
function tailLog(id) {
  clearTimeout(logTail.timer);
  logTail = { job: id, offset: 0, timer: null };
  const step = async () => {
    const pre = document.getElementById("job-log");
    if (!pre || logTail.job !== id) return;
    try {
      const chunk = await api(`/jobs/${id}/logs?offset=${logTail.offset}`);
      if (chunk.text) pre.append(chunk.text);
      logTail.offset = chunk.next_offset;
      if (chunk.finished && !chunk.text) return;
    } catch (e) {
      if (e.status === 409) { /* not started yet */ } else { pre.dataset.error = e.message; return; }
    }
    logTail.timer = setTimeout(step, REFRESH_MS);
  };
  step();
}

async function openJob(id) {
  selected = id;
  const panel = document.getElementById("panel");
  try {
    panel.replaceChildren(el("button", { onclick: closeJob, id: "close-panel" }, "×"), await jobDetails(id));
    panel.hidden = false;
    tailLog(id);
  } catch (e) { panel.replaceChildren(el("p", { class: "error" }, e.message)); panel.hidden = false; }
  for (const r of document.querySelectorAll("rect.job")) r.classList.toggle("selected", Number(r.dataset.job) === id);
}

function closeJob() {
  selected = null;
  clearTimeout(logTail.timer);
  document.getElementById("panel").hidden = true;
}

async function jobView(id) {
  show(await jobDetails(id));
  tailLog(id);
}

// ---- routing ----

const views = { plan: planView, queue: queueView, nodes: nodesView, cluster: clusterView };

async function render(auto) {
  clearTimeout(timer);
  // A refresh waits while the user is typing in a filter.
  const focused = document.activeElement;
  if (auto && focused && focused !== document.body && document.getElementById("view").contains(focused)) {
    timer = setTimeout(() => render(true), REFRESH_MS);
    return;
  }
  const [, name, arg] = (location.hash || "#/plan").split("/");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.id === "nav-" + name);
  try {
    if (name === "job") await jobView(Number(arg));
    else await (views[name] || planView)();
    document.body.dataset.rendered = String(Date.now());
    document.body.dataset.route = location.hash;
  } catch (e) { failed(e); }
  // Live: the lists and the plan are read again every refresh while shown.
  if (name !== "job" && document.visibilityState !== "hidden") timer = setTimeout(() => render(true), REFRESH_MS);
}

async function signIn(message) {
  clearTimeout(timer);
  const form = document.getElementById("login");
  document.getElementById("view").replaceChildren();
  document.getElementById("login-error").textContent = message || "";
  form.hidden = false;
  form.onsubmit = async (e) => {
    e.preventDefault();
    token = document.getElementById("token").value.trim();
    sessionStorage.setItem("quorum-token", token);
    form.hidden = true;
    start();
  };
}

async function start() {
  if (!token) return signIn();
  try {
    const me = await api("/whoami");
    document.getElementById("who").textContent = `${me.user} (${me.role})`;
    document.body.dataset.user = me.user;
  } catch (e) { return failed(e); }
  render();
}

window.addEventListener("hashchange", () => { closeJob(); render(); });
document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") render(); });
// A token handed over in the address (#token=...) is kept for this tab and taken out of it:
// the part after # never reaches a server.
if (location.hash.startsWith("#token=")) {
  token = decodeURIComponent(location.hash.slice("#token=".length));
  sessionStorage.setItem("quorum-token", token);
  history.replaceState(null, "", location.pathname + "#/plan");
}
start();
