// The dashboard: polls the daemon's API (through this server) and streams the selected task's steps.
// Everything is drawn with the DOM and inline SVG: no library, nothing from the network.
"use strict";

const POLL_MS = 2000;
const SLOW_POLL_MS = 10000;
const state = { task: null, source: null, treeKey: null, reverted: new Set() };

// --- talking to the daemon ---------------------------------------------------------------------

async function api(path, options = {}) {
  const init = { credentials: "same-origin", ...options };
  if (init.method === "POST") {
    init.headers = { "Content-Type": "application/json", "X-Evolver-UI": "1" };
  }
  const reply = await fetch(`/api/v1/${path}`, init);
  const body = await reply.json().catch(() => ({}));
  if (!reply.ok) {
    const message = (body.error && body.error.message) || `the daemon answered ${reply.status}`;
    throw new Error(message);
  }
  return body;
}

function post(path, body) {
  return api(path, { method: "POST", body: JSON.stringify(body) });
}

function banner(message) {
  const el = document.getElementById("banner");
  el.hidden = !message;
  el.textContent = message || "";
}

// --- small helpers ---------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

const drawn = {};

// Redraws a table only when its data changed, so a row being clicked or hovered is not replaced under the
// pointer every poll; ``rows`` is a function, called only then.
function fill(tableId, data, rows) {
  const key = JSON.stringify(data);
  if (drawn[tableId] === key) return;
  drawn[tableId] = key;
  document.querySelector(`#${tableId} tbody`).replaceChildren(...rows());
}

function ago(at) {
  if (at === null || at === undefined) return "-";
  const s = Date.now() / 1000 - at;
  const [n, unit] = Math.abs(s) < 90 ? [s, "s"] : Math.abs(s) < 5400 ? [s / 60, "min"]
    : Math.abs(s) < 129600 ? [s / 3600, "h"] : [s / 86400, "d"];
  return s >= 0 ? `${Math.round(n)} ${unit} ago` : `in ${Math.round(-n)} ${unit}`;
}

function pct(rate) {
  return rate === null || rate === undefined ? "-" : `${Math.round(rate * 100)}%`;
}

function effectText(effect) {
  if (!effect || !effect.exposures) return "not shown yet";
  if (!effect.compared) return `shown ${effect.exposures}×; none without it to compare`;
  const [low, high] = effect.interval;
  const sign = effect.difference >= 0 ? "+" : "";
  return `${sign}${Math.round(effect.difference * 100)} pts [${Math.round(low * 100)}, ${Math.round(high * 100)}]` +
    ` over ${effect.compared} compared; helped ${effect.helped}, hurt ${effect.hurt}`;
}

// --- status, spend, jobs, learning ------------------------------------------------------------

function showStatus(status) {
  const q = status.queue || {};
  document.getElementById("summary").textContent =
    `${status.mood} · model ${status.model}` +
    (status.meta_model && status.meta_model !== status.model ? ` · meta model ${status.meta_model}` : "") +
    ` · serving ${status.incumbent || "-"} · ${status.workers} workers` +
    (status.sandbox_isolated ? "" : " · SANDBOX NOT ISOLATED");
  const ended = ["done", "failed", "cancelled", "dead"].filter((k) => q[k]).map((k) => `${q[k]} ${k}`);
  document.getElementById("queue-line").textContent =
    `${q.queued || 0} queued, ${q.running || 0} running` + (ended.length ? ` (so far: ${ended.join(", ")})` : "");

  const b = status.budget;
  const bars = [["tokens", b.tokens_today, b.tokens_per_day], ["USD", b.usd_today, b.usd_per_day]].map(
    ([what, used, cap]) => {
      const share = cap ? used / cap : 0;
      const fillEl = el("div", { class: `fill${share >= 1 ? " over" : share >= 0.8 ? " high" : ""}` });
      fillEl.style.width = `${Math.min(100, share * 100)}%`;
      const label = cap ? `${what}: ${used.toLocaleString()} of ${cap.toLocaleString()} a day`
        : `${what}: ${used.toLocaleString()} (no cap)`;
      return el("div", { class: "bar" }, el("span", {}, label), el("div", { class: "track" }, fillEl));
    });
  const models = Object.entries(b.by_model || {});
  if (models.length > 1) {  // a task model and a meta model: each one's share of today's spend
    bars.push(el("div", { class: "muted" }, models.map(([m, s]) =>
      `${m}: ${s.tokens.toLocaleString()} tokens, $${s.usd.toFixed(4)}`).join(" · ")));
  }
  document.getElementById("spend").replaceChildren(...bars);

  fill("jobs", [status.jobs, Math.floor(Date.now() / 60000)], () => (status.jobs || []).map((job) => {
    const pace = `every ${job.every_min} min` + (job.after ? `, or after ${job.after} new` : "");
    const last = job.last ? `${ago(job.last.at)}${job.last.ok ? "" : " FAILED"}: ${job.last.summary}` : "-";
    return el("tr", {}, el("td", {}, job.job), el("td", {}, pace), el("td", { class: "clip", title: last }, last),
      el("td", {}, job.running ? "running" : ago(job.next_run_at)));
  }));

  const learning = status.learning;
  if (!learning) return;
  const w = learning.windows;
  const row = (label, get) => el("tr", {}, el("th", {}, label), el("td", {}, get(w.day)), el("td", {}, get(w.week)));
  const results = (r) => `${pct(r.rate)} (${r.succeeded} of ${r.succeeded + r.failed} judged)`;
  fill("learning", w, () => [
    row("your tasks", (x) => results(x.person)),
    row("evaluations", (x) => results(x.evaluations)),
    row("insights added / retired", (x) => `${x.insights_added} / ${x.insights_retired}`),
    row("tools added / retired", (x) => `${x.tools_added} / ${x.tools_retired}`),
    row("spend: yours / background", (x) =>
      `${x.spend.person.tokens.toLocaleString()} / ${x.spend.background.tokens.toLocaleString()} tokens`),
  ]);
  const best = learning.best_candidate;
  document.getElementById("candidate").textContent = best
    ? `best candidate ${best.node}: held-out ${best.held_out[0]}/${best.held_out[1]}, ${best.why_not_serving}`
    : "no candidate besides the incumbent yet";
}

// --- charts (inline SVG) --------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawCurve(curve) {
  const W = 560, H = 180, L = 34, B = 22, T = 8;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "success over time" });
  const x = (i) => L + (i + 0.5) * (W - L - 8) / curve.points.length;
  const y = (rate) => T + (1 - rate) * (H - T - B);
  for (const tick of [0, 0.5, 1]) {
    root.append(svg("line", { x1: L, x2: W - 4, y1: y(tick), y2: y(tick), stroke: "#eaeef2" }));
    root.append(svg("text", { x: 2, y: y(tick) + 4, "font-size": 10, fill: "#57606a" }, `${tick * 100}%`));
  }
  const series = [["person", "#0969da", "your tasks"], ["evaluations", "#8250df", "evaluations"]];
  series.forEach(([key, colour, label], n) => {
    let path = "";
    curve.points.forEach((p, i) => {
      const r = p[key];
      if (r.rate === null) return;
      path += `${path ? "L" : "M"}${x(i).toFixed(1)},${y(r.rate).toFixed(1)}`;
      root.append(svg("circle", { cx: x(i), cy: y(r.rate), r: 2.5 + Math.min(4, Math.sqrt(r.succeeded + r.failed)),
        fill: colour, "fill-opacity": 0.7 }, undefined));
      root.lastChild.append(svg("title", {}, `${label}: ${r.succeeded}/${r.succeeded + r.failed}`));
    });
    if (path) root.append(svg("path", { d: path, stroke: colour, fill: "none", "stroke-width": 1.5 }));
    root.append(svg("text", { x: L + 8 + n * 120, y: H - 6, "font-size": 11, fill: colour }, `● ${label}`));
  });
  root.append(svg("text", { x: W - 4, y: H - 6, "font-size": 10, fill: "#57606a", "text-anchor": "end" }, "now"));
  const judged = curve.points.some((p) => p.person.rate !== null || p.evaluations.rate !== null);
  const holder = document.getElementById("curve");
  holder.replaceChildren(judged ? root : el("p", { class: "muted" }, "no judged task in the last week yet"));

  const nodes = curve.nodes;
  const rowH = 18, NW = 560;
  const bars = svg("svg", { viewBox: `0 0 ${NW} ${Math.max(1, nodes.length) * rowH + 6}`, role: "img",
    "aria-label": "success per node" });
  nodes.forEach((node, i) => {
    const own = node.successes + node.failures, held = node.held_out_successes + node.held_out_failures;
    const yTop = 3 + i * rowH;
    bars.append(svg("text", { x: 0, y: yTop + 12, "font-size": 11 }, node.short_id || node.id));
    const scale = NW - 330;
    bars.append(svg("rect", { x: 110, y: yTop + 2, width: scale, height: 12, fill: "#eaeef2" }));
    if (own) {  // the mean of a node never evaluated is only the prior (50%): no bar for it
      bars.append(svg("rect", { x: 110, y: yTop + 2, width: scale * node.successes / own, height: 12,
        fill: node.status === "invalid" ? "#d0d0d0" : "#2da44e" }));
    }
    bars.append(svg("text", { x: 116 + scale, y: yTop + 12, "font-size": 11 },
      `${own ? pct(node.successes / own) : "-"} own ${node.successes}/${own} · held-out ${node.held_out_successes}/${held}`));
  });
  document.getElementById("per-node").replaceChildren(bars);
}

// --- tasks and their live steps ------------------------------------------------------------

function showTasks(list) {
  fill("tasks", [list.tasks, state.task], () => list.tasks.map((task) => {
    const tr = el("tr", { class: `task${task.id === state.task ? " selected" : ""}`, "data-id": task.id,
      onclick: () => follow(task.id) },
      el("td", { title: task.id }, task.short_id), el("td", { class: `status-${task.status}` }, task.status),
      el("td", {}, task.source), el("td", {}, task.attempts),
      el("td", { class: "clip", title: task.prompt }, task.prompt));
    return tr;
  }));
}

function stepItem(step) {
  const calls = (step.tool_calls || []).map((c) =>
    c.arguments === null && c.raw ? `${c.name || "unreadable call"}: ${c.raw} (refused)`
      : `${c.name}(${JSON.stringify(c.arguments)})`);
  const text = step.role === "assistant" && calls.length ? calls.join("\n") : step.content;
  return el("li", { class: `step step-${step.role}` },
    el("span", { class: "role" }, step.role), el("span", { class: "attempt" }, `attempt ${step.attempt}`),
    el("pre", {}, text.length > 4000 ? `${text.slice(0, 4000)}…` : text));
}

function follow(taskId) {
  if (state.source) state.source.close();
  state.task = taskId;
  document.querySelectorAll("tr.task").forEach((tr) => tr.classList.toggle("selected", tr.dataset.id === taskId));
  document.getElementById("steps-task").textContent = taskId;
  document.getElementById("steps").replaceChildren();
  const status = document.getElementById("steps-status");
  status.textContent = "following…";
  const cancel = document.getElementById("cancel-task");
  cancel.hidden = false;
  const source = new EventSource(`/api/v1/tasks/${encodeURIComponent(taskId)}/events`);
  state.source = source;
  source.addEventListener("step", (event) => {
    const list = document.getElementById("steps");
    list.append(stepItem(JSON.parse(event.data)));
    list.scrollTop = list.scrollHeight;
  });
  source.addEventListener("end", (event) => {
    const task = JSON.parse(event.data);
    status.textContent = `${task.status}${task.ending ? ` (${task.ending})` : ""}` +
      (task.error ? `: ${task.error}` : "");
    status.className = `status-${task.status}`;
    cancel.hidden = true;
    source.close();
  });
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) status.textContent = "the stream closed; click the task again";
  };
}

// --- insights, tools, history ----------------------------------------------------------------

// An insight on probation (imported from a pack) is shown to no task of the person's until they approve it
// here or it is measured to help on the promotion split; its row says where it came from.
function showInsights(data) {
  fill("insights", data, () => data.insights.map((i) => {
    let status = i.status;
    if (i.status === "probation") {
      const from = i.provenance.filter((p) => typeof p === "string" && p.startsWith("pack:")).join(", ");
      status = el("span", {}, `on probation${from ? ` (from ${from})` : ""} `,
        el("button", { class: "approve", "data-id": i.id, onclick: () => approve(i) }, "Approve"));
    }
    return el("tr", { "data-id": i.id }, el("td", {}, i.id), el("td", {}, i.text), el("td", {}, status),
      el("td", {}, i.importance), el("td", {}, effectText(i.effect)));
  }));
}

async function approve(insight) {
  try {
    await post(`insights/${insight.id}/approve`, { why: "approved from the dashboard" });
    banner("");
    refreshSlow();
  } catch (error) {
    banner(`approval refused: ${error.message}`);
  }
}

function showTools(data) {
  fill("tools", data, () => data.synthesized.map((t) => el("tr", {},
    el("td", { title: t.description || "" }, `${t.name} v${t.version}`), el("td", {}, t.status),
    el("td", {}, `${t.uses} (${t.successes} ok)`), el("td", {}, effectText(t.effect)))));
}

const FIXED_KINDS = new Set(["promote", "rollback", "seed", "revert", "job", "job_failed", "distill_skipped"]);

function showHistory(data) {
  const reverted = new Set(data.events.filter((e) => e.reverts).map((e) => e.reverts));
  fill("history", [data, Math.floor(Date.now() / 60000)], () => data.events.map((e) => {
    let action = "";
    if (reverted.has(e.id)) action = el("span", { class: "muted" }, "reverted");
    else if (!FIXED_KINDS.has(e.kind)) {
      action = el("button", { class: "revert", "data-id": e.id, onclick: () => askRevert(e) }, "Revert…");
    }
    return el("tr", { "data-id": e.id }, el("td", {}, e.id), el("td", {}, ago(e.at)), el("td", {}, e.kind),
      el("td", { class: "clip", title: `${e.what}\n${e.why}` }, e.what), el("td", {}, action));
  }));
}

function askRevert(event) {
  const dialog = document.getElementById("confirm-revert");
  document.getElementById("revert-id").textContent = event.id;
  document.getElementById("revert-what").textContent = `${event.kind}: ${event.what}`;
  dialog.onclose = async () => {
    if (dialog.returnValue !== "confirm") return;
    try {
      await post(`history/${event.id}/revert`, { why: document.getElementById("revert-why").value });
      banner("");
      refreshSlow();
    } catch (error) {
      banner(`revert refused: ${error.message}`);
    }
  };
  dialog.returnValue = "";
  dialog.showModal();
}

// --- the refresh loops ---------------------------------------------------------------------

async function refresh() {
  try {
    const [status, tasks] = await Promise.all([api("status"), api("tasks?limit=15")]);
    showStatus(status);
    showTasks(tasks);
    banner("");
  } catch (error) {
    banner(error.message);
  }
}

async function refreshSlow() {
  try {
    const [curve, insights, tools, history] = await Promise.all(
      [api("learning/curve"), api("insights?status=current"), api("tools"), api("history?limit=50")]);
    drawCurve(curve);
    showInsights(insights);
    showTools(tools);
    showHistory(history);
    // The tree page is reloaded only when the tree changed, so an opened node stays open.
    const key = JSON.stringify(curve.nodes);
    if (state.treeKey !== null && key !== state.treeKey) document.getElementById("tree").contentWindow.location.reload();
    state.treeKey = key;
  } catch (error) {
    banner(error.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("submit-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const prompt = document.getElementById("prompt").value.trim();
    const expected = document.getElementById("check").value.trim();
    try {
      const task = await post("tasks", { prompt, ...(expected ? { check: { type: "answer", expected } } : {}) });
      document.getElementById("prompt").value = "";
      document.getElementById("check").value = "";
      await refresh();
      follow(task.id);
    } catch (error) {
      banner(`not submitted: ${error.message}`);
    }
  });
  document.getElementById("cancel-task").addEventListener("click", async () => {
    try {
      await post(`tasks/${encodeURIComponent(state.task)}/cancel`, {});
    } catch (error) {
      banner(`not cancelled: ${error.message}`);
    }
  });
  refresh();
  refreshSlow();
  setInterval(refresh, POLL_MS);
  setInterval(refreshSlow, SLOW_POLL_MS);
});
