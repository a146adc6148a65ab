// The opledger dashboard: plain JavaScript, no build step.
//
// Every string from the ledger is inserted as text (textContent, attribute
// values), never as HTML: names, paths and errors are untrusted. The token
// is kept in sessionStorage and sent as a bearer header; no cookie
// authenticates, so no other site can act with it. Live updates read
// /api/v1/events with fetch (EventSource cannot send the header), parse the
// server-sent events, and refresh the visible view, debounced.
"use strict";

const TOKEN_KEY = "opledger-token";
const HOUR_MS = 60 * 60 * 1000;
const state = { view: "overview", lastEventId: null, stream: null, refreshTimer: null, history: [], bulk: null };

const $ = (id) => document.getElementById(id);

// Bidirectional controls (U+202E turns "/adv/\u202Eevil" into "/adv/live"
// on screen) are shown as visible marks, never obeyed.
const BIDI_CONTROLS = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;

function visible(text) {
  return String(text).replace(BIDI_CONTROLS, (c) => "<U+" + c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0") + ">");
}

// A text from the ledger as a node: its controls made visible, and isolated
// (<bdi>) so that a right-to-left name never reorders what stands around it.
function text(value) {
  const node = document.createElement("bdi");
  node.textContent = visible(value);
  return node;
}

// Builds an element; strings among the children become isolated text.
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else if (key === "on") for (const [name, handler] of Object.entries(value)) node.addEventListener(name, handler);
    else node.setAttribute(key, visible(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : text(child));
  }
  return node;
}

function replace(node, ...children) {
  node.replaceChildren(...children.filter((child) => child !== null && child !== undefined));
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function showError(message) {
  const box = $("error");
  box.textContent = visible(message);
  box.hidden = !message;
}

async function api(path, options = {}) {
  const headers = { Authorization: "Bearer " + token() };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (!response.ok) {
    const message = body && body.error ? body.error.message : response.status + " " + response.statusText;
    if (response.status === 401) logout();
    throw new Error(message);
  }
  return body;
}

function rows(table, header, items, render) {
  const head = el("tr", {}, ...header.map((name) => el("th", {}, name)));
  replace(table, head, ...items.map(render));
}

function counts(table, object) {
  rows(table, ["status", "count"], Object.entries(object || {}), ([name, count]) =>
    el("tr", {}, el("td", {}, name), el("td", {}, count)));
}

// ---- views ----

async function overview() {
  const status = await api("/api/v1/status");
  counts($("ops-by-status"), status.operations_by_status);
  counts($("caps-by-status"), status.capabilities_by_status);
  rows($("projections"), ["projection", "position", "lag"], status.projections || [], (p) =>
    el("tr", {}, el("td", {}, p.name), el("td", {}, p.position), el("td", {}, p.lag)));
  rows($("active-batches"), ["batch", "status", "progress"], status.active_batches || [], (batch) =>
    el("tr", {}, el("td", {}, batch.name), el("td", {}, batch.status),
      el("td", {}, progressBar(batch), ` ${batch.settled}/${batch.total}`)));
  await sample(status);
  drawChart();
}

// One point of the chart: completions seen so far and the oldest
// claimable task's age, from /metrics (Prometheus text).
async function sample(status) {
  let age = 0;
  try {
    const text = await (await fetch("/metrics")).text();
    for (const line of text.split("\n")) {
      if (line.startsWith("opledger_claim_queue_age_seconds{")) {
        age = Math.max(age, Number(line.split(" ").pop()) || 0);
      }
    }
  } catch (_) { /* the chart keeps its last points */ }
  const done = status.operations_by_status ? (status.operations_by_status.succeeded || 0) : 0;
  const now = Date.now();
  state.history.push({ at: now, done, age });
  state.history = state.history.filter((point) => now - point.at <= HOUR_MS);
}

function drawChart() {
  const ns = "http://www.w3.org/2000/svg";
  const width = 600, height = 120;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const points = state.history;
  const now = Date.now();
  const x = (at) => width - ((now - at) / HOUR_MS) * width;
  const perMinute = [];
  for (let i = 1; i < points.length; i++) {
    const minutes = Math.max((points[i].at - points[i - 1].at) / 60000, 1 / 60);
    perMinute.push({ at: points[i].at, value: Math.max(points[i].done - points[i - 1].done, 0) / minutes });
  }
  const ages = points.map((point) => ({ at: point.at, value: point.age }));
  for (const [series, cls] of [[perMinute, "throughput"], [ages, "age"]]) {
    const top = Math.max(1, ...series.map((point) => point.value));
    const path = document.createElementNS(ns, "polyline");
    path.setAttribute("class", cls);
    path.setAttribute("points", series.map((p) => `${x(p.at).toFixed(1)},${(height - 4 - (p.value / top) * (height - 8)).toFixed(1)}`).join(" "));
    svg.append(path);
  }
  replace($("chart"), svg);
}

async function batches() {
  const page = await api("/api/v1/batches?limit=50");
  rows($("batch-list"), ["name", "status", "progress", "", ""], page.items || [], (batch) => {
    const bar = progressBar(batch);
    const act = (what) => el("button", { type: "button", on: { click: () => batchAction(batch.batch_id, what) } }, what);
    return el("tr", { "data-batch": batch.batch_id },
      el("td", {}, batch.name),
      el("td", {}, batch.status),
      el("td", {}, bar, ` ${batch.settled}/${batch.total}`),
      el("td", {}, batch.active || batch.blocked > 0 ? act("cancel") : null),
      el("td", {}, batch.failed + batch.cancelled > 0 ? act("resume") : null));
  });
}

function progressBar(batch) {
  return el("progress", { max: Math.max(batch.total, 1), value: batch.settled, "data-batch": batch.batch_id });
}

async function batchAction(id, what) {
  await run(() => api(`/api/v1/batches/${encodeURIComponent(id)}/${what}`, { method: "POST", body: { reason: "dashboard" } }));
}

async function review() {
  const page = await api("/api/v1/review?limit=100");
  rows($("review-list"), ["entry", "kind", "path", "reason", "detail", ""], page.items || [], (entry) => {
    const resolve = (action) => el("button", {
      type: "button", "data-action": action, "data-entry": entry.entry_id,
      on: { click: () => run(() => api(`/api/v1/review/${encodeURIComponent(entry.entry_id)}/resolve`, { method: "POST", body: { action, reason: "dashboard" } })) },
    }, action);
    return el("tr", { "data-entry": entry.entry_id },
      el("td", {}, entry.entry_id), el("td", {}, entry.kind), el("td", {}, entry.path || ""),
      el("td", {}, entry.reason_code), el("td", {}, entry.detail || ""),
      el("td", {}, resolve("retry"), resolve("dismiss"), resolve("acknowledge")));
  });
}

async function bulkPreview() {
  const answer = await api("/api/v1/review/resolve", { method: "POST", body: { action: "retry", dry_run: true, reason: "dashboard bulk retry" } });
  const count = answer && Array.isArray(answer.resolved) ? answer.resolved.length : (answer && answer.count) || 0;
  $("bulk-result").textContent = `would retry ${count} entries`;
  $("bulk-apply").disabled = count === 0;
}

async function bulkApply() {
  const answer = await api("/api/v1/review/resolve", { method: "POST", body: { action: "retry", dry_run: false, reason: "dashboard bulk retry" } });
  const count = answer && Array.isArray(answer.resolved) ? answer.resolved.length : 0;
  $("bulk-result").textContent = `retried ${count} entries`;
  $("bulk-apply").disabled = true;
  refreshSoon();
}

async function operations() {
  const form = new FormData($("op-search"));
  const query = new URLSearchParams({ limit: "50" });
  for (const [key, value] of form.entries()) if (value) query.set(key, value);
  const page = await api("/api/v1/operations?" + query);
  rows($("op-list"), ["operation", "kind", "status", "path", "error"], page.items || [], (op) =>
    el("tr", {},
      el("td", {}, el("button", { type: "button", on: { click: () => run(() => describe(op.operation_id)) } }, op.operation_id)),
      el("td", {}, op.kind), el("td", {}, op.status), el("td", {}, op.path || ""), el("td", {}, op.last_error || "")));
}

async function describe(id) {
  const [description, timeline] = await Promise.all([
    api(`/api/v1/operations/${encodeURIComponent(id)}`),
    api(`/api/v1/operations/${encodeURIComponent(id)}/timeline`),
  ]);
  const events = (timeline && (timeline.items || timeline.events || timeline)) || [];
  const list = el("ol", {}, ...(Array.isArray(events) ? events : []).map((event) =>
    el("li", {}, `${event.recorded_at || ""} ${event.type || event.event_type || ""} by ${event.actor || ""}`)));
  replace($("op-detail"), el("h3", {}, "Operation ", id), el("pre", {}, JSON.stringify(description, null, 2)), list);
}

const thumbnails = new Map();

async function thumbnail(id, img) {
  if (thumbnails.has(id)) { img.src = thumbnails.get(id); return; }
  const response = await fetch(`/api/v1/media/${encodeURIComponent(id)}/thumbnail`, { headers: { Authorization: "Bearer " + token() } });
  if (!response.ok) return;
  const url = URL.createObjectURL(await response.blob());
  thumbnails.set(id, url);
  img.src = url;
}

async function media() {
  const form = new FormData($("media-filter"));
  const query = new URLSearchParams({ limit: "60" });
  for (const [key, value] of form.entries()) if (value) query.set(key, value);
  const page = await api("/api/v1/media?" + query);
  const tiles = (page.items || []).map((item) => {
    const img = el("img", { alt: "" });
    thumbnail(item.media_id, img).catch(() => {});
    const capabilities = item.capabilities || [];
    return el("div", { class: "tile", "data-media": item.media_id }, img,
      el("div", { class: "path" }, item.path),
      el("div", {}, ...capabilities.map((c) => el("span", { class: "badge " + (c.status || "") }, `${c.capability || c.name}: ${c.status}`))));
  });
  replace($("media-grid"), ...tiles);
}

const VIEWS = { overview, batches, review, operations, media };

async function run(action) {
  try { showError(""); await action(); } catch (error) { showError(error.message); }
}

// Refreshes run one after another, so an older answer never lands after a
// newer one (a bar would step back).
let refreshing = Promise.resolve();
function refresh() {
  refreshing = refreshing.then(() => run(VIEWS[state.view]));
  return refreshing;
}

// Live events ask for a refresh within REFRESH_MS; the events that arrive
// meanwhile join the one already asked for. A timer that restarted on every
// event would never fire while the log keeps moving, so a busy ledger would
// freeze the page.
const REFRESH_MS = 300;
function refreshSoon() {
  if (state.refreshTimer !== null) return;
  state.refreshTimer = setTimeout(() => { state.refreshTimer = null; refresh(); }, REFRESH_MS);
}

function show(view) {
  state.view = view;
  for (const section of document.querySelectorAll("#views > section")) section.hidden = section.dataset.view !== view;
  for (const button of document.querySelectorAll("#nav button")) button.classList.toggle("active", button.dataset.view === view);
  refresh();
}

// ---- live updates: fetch streaming of server-sent events ----

async function follow() {
  const controller = new AbortController();
  state.stream = controller;
  const headers = { Authorization: "Bearer " + token() };
  if (state.lastEventId !== null) headers["Last-Event-ID"] = state.lastEventId;
  try {
    const response = await fetch("/api/v1/events", { headers, signal: controller.signal });
    if (!response.ok || !response.body) throw new Error("events: " + response.status);
    setLive(true);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of block.split("\n")) {
          if (line.startsWith("id:")) state.lastEventId = line.slice(3).trim();
        }
        if (!block.startsWith(":")) refreshSoon();
      }
    }
  } catch (_) { /* reconnect below */ }
  setLive(false);
  if (state.stream === controller && token()) setTimeout(follow, 1000);
}

function setLive(on) {
  const badge = $("live");
  badge.textContent = on ? "live" : "offline";
  badge.classList.toggle("on", on);
  badge.classList.toggle("off", !on);
}

// ---- start ----

function start() {
  $("login").hidden = true;
  $("views").hidden = false;
  show(state.view);
  if (!state.stream) follow();
}

function logout() {
  sessionStorage.removeItem(TOKEN_KEY);
  if (state.stream) state.stream.abort();
  state.stream = null;
  $("login").hidden = false;
  $("views").hidden = true;
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    start();
  });
  $("forget").addEventListener("click", logout);
  for (const button of document.querySelectorAll("#nav button")) button.addEventListener("click", () => show(button.dataset.view));
  $("op-search").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
  $("media-filter").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
  $("bulk-preview").addEventListener("click", () => run(bulkPreview));
  $("bulk-apply").addEventListener("click", () => run(bulkApply));
  setInterval(() => { if (state.view === "overview" && token()) refresh(); }, 60000);
  if (token()) start();
});
