// tidegate dashboard: polls the gateway's admin API (GET v1/stats, GET v1/dlq, GET
// v1/admin/provider-batches), its batches (GET v1/batches: an admin sees every tenant's) and its
// recommendations API (GET v1/health, GET v1/recommendations/{user}) and draws what they
// answer. Plain JavaScript with no library and no request beyond this gateway, because the page
// must work on machines without internet access. Every value from the server is written with
// textContent or as an SVG attribute, never as HTML: error messages in dead letters come from
// providers and tenants.
"use strict";

(() => {
  const POLL_MS = 1500;
  const HISTORY_MS = 10 * 60 * 1000; // what the charts show, kept in memory only
  const RATE_WINDOW_MS = 15 * 1000; // counter rates are taken over this span to smooth the noise
  const KEY_STORAGE = "tidegate.adminKey";
  const DLQ_LIMIT = 100;
  const BATCHES_LIMIT = 20;
  const PROVIDER_BATCHES_LIMIT = 10;
  const PRIORITIES = ["critical", "high", "normal", "low", "bulk"];

  // A key given in the address, /dashboard#key=tg_…, for a bookmark or a headless screenshot.
  // In the fragment, it never reaches the server (nor its logs); it is kept like a typed key and
  // taken out of the address bar and history at once, so it is not shared with a copied link.
  function keyFromAddress() {
    const given = new URLSearchParams(window.location.hash.slice(1)).get("key");
    if (given === null) return null;
    history.replaceState(null, "", window.location.pathname + window.location.search);
    const key = given.trim();
    if (!key) return null;
    sessionStorage.setItem(KEY_STORAGE, key);
    return key;
  }

  const state = {
    key: keyFromAddress() || sessionStorage.getItem(KEY_STORAGE),
    paused: false,
    lastOk: 0, // Date.now() of the last successful poll
    failing: false,
    history: [], // one entry per successful poll, oldest first
    stats: null,
    dlq: null,
    dlqSignature: "",
    batches: null,
    providerBatches: null,
    timer: 0,
    polling: false,
    pollAgain: false,
    confirmAllUntil: 0,
  };

  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------- formatting

  function fmtMs(ms) {
    if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
    if (ms === 0) return "0 ms";
    if (ms < 10) return `${ms.toFixed(1)} ms`;
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const s = ms / 1000;
    if (s < 10) return `${s.toFixed(2)} s`;
    if (s < 60) return `${s.toFixed(1)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${String(Math.floor(s % 60)).padStart(2, "0")}s`;
    return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
  }

  // "2.7 / 4.5 ms" rather than "2.7 ms / 4.5 ms" when both share the unit, to fit a tile.
  function fmtPair(a, b) {
    const left = fmtMs(a);
    const right = fmtMs(b);
    const unit = / ms$/;
    return unit.test(left) && unit.test(right) ? `${left.replace(unit, "")} / ${right}` : `${left} / ${right}`;
  }

  function fmtCount(n) {
    if (n === null || n === undefined) return "—";
    return Math.round(n).toLocaleString("en-US");
  }

  function fmtRate(n) {
    if (n === null || n === undefined) return "—";
    return n >= 10 || Number.isInteger(n) ? Math.round(n).toLocaleString("en-US") : n.toFixed(1);
  }

  // Money arrives as a decimal string (exact); four decimals are what a person compares.
  function fmtUsd(text) {
    if (text === null || text === undefined) return "—";
    return `$${Number(text).toFixed(4)}`;
  }

  function fmtAgo(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return `${s} s ago`;
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    return `${Math.floor(s / 3600)} h ago`;
  }

  function fmtTime(iso) {
    if (!iso) return "—";
    const when = new Date(iso);
    const sameDay = when.toDateString() === new Date().toDateString();
    const clock = when.toLocaleTimeString([], { hour12: false });
    return sameDay ? clock : `${when.toLocaleDateString()} ${clock}`;
  }

  // ---------------------------------------------------------------- DOM helpers

  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props)) {
      if (value === undefined || value === null) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (name === "data") Object.assign(node.dataset, value);
      else if (name === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
      else node.setAttribute(name, value);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function cell(text, { num = false, cls = "", col, title } = {}) {
    const classes = [num ? "num" : "", cls].filter(Boolean).join(" ");
    return el("td", { class: classes || undefined, text, title, data: col ? { col } : undefined });
  }

  function svg(tag, attrs = {}) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    return node;
  }

  // ---------------------------------------------------------------- the API

  class ApiFailure extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path, init = {}) {
    const headers = { Accept: "application/json" };
    if (init.body) headers["Content-Type"] = "application/json";
    // The key travels in a header only: a URL ends up in logs and browser history.
    if (state.key) headers.Authorization = `Bearer ${state.key}`;
    let answer;
    try {
      answer = await fetch(path, { ...init, headers, cache: "no-store", credentials: "omit" });
    } catch (exc) {
      throw new ApiFailure(0, `the gateway does not answer (${exc.message})`);
    }
    if (answer.ok) return answer.json();
    let message = `HTTP ${answer.status}`;
    try {
      const body = await answer.json();
      if (body && body.error && body.error.message) message = `${message}: ${body.error.message}`;
    } catch {
      // not JSON (a proxy's page): the status says enough
    }
    throw new ApiFailure(answer.status, message);
  }

  // ---------------------------------------------------------------- polling

  function schedule(delayMs = POLL_MS) {
    clearTimeout(state.timer);
    state.timer = setTimeout(poll, delayMs);
  }

  // `force`: poll even while paused (a refresh after a redrive).
  async function poll(force = false) {
    if (state.polling) {
      state.pollAgain = true; // an immediate refresh (after a redrive) was asked during a poll
      return;
    }
    if ((state.paused && !force) || !$("login").hidden) return;
    state.polling = true;
    try {
      const [stats, dlq, batches, providerBatches] = await Promise.all([
        api("v1/stats"), api(`v1/dlq?limit=${DLQ_LIMIT}`), api(`v1/batches?limit=${BATCHES_LIMIT}`),
        api(`v1/admin/provider-batches?limit=${PROVIDER_BATCHES_LIMIT}`)]);
      onData(stats, dlq, batches, providerBatches);
    } catch (exc) {
      onFailure(exc);
    } finally {
      state.polling = false;
      if (state.pollAgain) {
        state.pollAgain = false;
        refreshNow();
      } else if (!state.paused && $("login").hidden) {
        schedule();
      }
    }
  }

  function refreshNow() {
    clearTimeout(state.timer);
    state.timer = setTimeout(() => poll(true), 0);
  }

  function onData(stats, dlq, batches, providerBatches) {
    state.stats = stats;
    state.dlq = dlq;
    state.batches = batches;
    state.providerBatches = providerBatches;
    state.lastOk = Date.now();
    state.failing = false;
    hideBanner();
    $("main").hidden = false;
    const mode = $("mode");
    mode.hidden = false;
    mode.textContent = state.key ? "admin key" : "embedded mode";
    mode.title = state.key
      ? "Authenticated with the admin key kept in this tab's session storage"
      : "Loopback gateway without tenants or keys: served without a key";
    $("forget-key").hidden = !state.key;
    remember(stats);
    render();
  }

  function onFailure(exc) {
    const status = exc instanceof ApiFailure ? exc.status : 0;
    if (status === 401 || status === 403) {
      authFailed(exc);
      return;
    }
    state.failing = true;
    const since = state.lastOk ? ` Showing data from ${fmtAgo(Date.now() - state.lastOk)}.` : "";
    showBanner(`Polling failed: ${exc.message}. Retrying every ${POLL_MS / 1000} s.${since}`);
    updateClock();
  }

  function authFailed(exc) {
    if (state.key) {
      // A key was given and refused (or is not an admin's): say so, and ask again.
      sessionStorage.removeItem(KEY_STORAGE);
      state.key = null;
      const why = exc.status === 403 ? "This key's tenant may not use the admin API" : "The key was refused";
      showBanner(`${why} (${exc.message}). Enter an admin key.`);
    }
    state.failing = true;
    $("main").hidden = true;
    $("mode").hidden = true;
    $("forget-key").hidden = true;
    $("login").hidden = false;
    $("key-input").focus();
    updateClock();
  }

  function showBanner(text) {
    const banner = $("banner");
    banner.textContent = text;
    banner.hidden = false;
  }

  function hideBanner() {
    $("banner").hidden = true;
  }

  let toastTimer = 0;
  function toast(text) {
    const node = $("toast");
    node.textContent = text;
    node.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { node.hidden = true; }, 3000);
  }

  function updateClock() {
    const dot = $("status-dot");
    const label = $("updated");
    if (!state.lastOk) {
      label.textContent = state.failing ? "no data" : "connecting…";
      dot.className = state.failing ? "dot error" : "dot";
      return;
    }
    const age = Date.now() - state.lastOk;
    label.textContent = state.paused ? `paused, updated ${fmtAgo(age)}` : `updated ${fmtAgo(age)}`;
    label.title = new Date(state.lastOk).toLocaleString();
    dot.className = state.failing ? "dot error" : age > 3 * POLL_MS ? "dot stale" : "dot ok";
  }

  // ---------------------------------------------------------------- history

  function sumJobs(byModel, outcome) {
    if (!byModel) return null;
    return Object.values(byModel).reduce((total, model) => total + (model.jobs[outcome] || 0), 0);
  }

  function remember(stats) {
    const now = Date.now();
    const byModel = stats.dispatch_by_model;
    const entry = {
      t: now,
      levels: {},
      seen: stats.throughput_last_minute,
      succeeded: sumJobs(byModel, "succeeded"),
      throttled: byModel ? Object.values(byModel).reduce((n, m) => n + m.throttled_429, 0) : null,
      inFlight: {},
      throttledByModel: {},
    };
    for (const name of PRIORITIES) {
      const level = stats.levels[name];
      if (!level) continue;
      entry.levels[name] = { depth: level.depth, p50: level.queue_wait_ms.p50, p99: level.queue_wait_ms.p99 };
    }
    for (const [model, view] of Object.entries(byModel || {})) {
      entry.inFlight[model] = view.in_flight;
      entry.throttledByModel[model] = view.throttled_429;
    }
    // Rates per minute from the counters, over the last RATE_WINDOW_MS of history.
    const base = state.history.find((old) => now - old.t <= RATE_WINDOW_MS);
    entry.workerRate = rate(base, entry, "succeeded");
    entry.throttledRate = rate(base, entry, "throttled");
    state.history.push(entry);
    while (state.history.length && now - state.history[0].t > HISTORY_MS) state.history.shift();
  }

  function rate(base, entry, field) {
    if (!base || base[field] === null || entry[field] === null || entry.t === base.t) return null;
    // A counter that went down means the workers restarted: no rate for this point.
    const delta = entry[field] - base[field];
    return delta < 0 ? null : (delta / (entry.t - base.t)) * 60000;
  }

  // ---------------------------------------------------------------- rendering

  function render() {
    const stats = state.stats;
    renderKpis(stats);
    renderLevels(stats);
    renderModels(stats);
    renderTenants(stats);
    renderDlq(state.dlq, stats.dead);
    renderBatches(state.batches);
    renderProviderBatches(state.providerBatches);
    renderCharts();
    updateClock();
  }

  function setKpi(id, text, alert = false) {
    const node = $(id);
    node.textContent = text;
    node.classList.toggle("alert", alert);
  }

  function renderKpis(stats) {
    setKpi("kpi-depth", fmtCount(stats.depth));
    setKpi("kpi-in-flight", fmtCount(stats.in_flight));
    setKpi("kpi-delayed", fmtCount(stats.delayed));
    setKpi("kpi-dead", fmtCount(stats.dead), stats.dead > 0);
    const last = state.history[state.history.length - 1];
    const perMinute = last && last.workerRate !== null ? last.workerRate : stats.throughput_last_minute;
    setKpi("kpi-throughput", `${fmtRate(perMinute)} /min`);
    setKpi("kpi-wait", fmtPair(stats.queue_wait_ms.p50, stats.queue_wait_ms.p99));
    setKpi("kpi-upstream", fmtPair(stats.upstream_latency_ms.p50, stats.upstream_latency_ms.p99));
    const global = stats.budgets_today["*"];
    const byModel = Object.values(stats.spend_today_by_model_usd).reduce((n, usd) => n + Number(usd), 0);
    setKpi("kpi-spend", fmtUsd(global ? global.spent_usd : byModel));
  }

  function priorityBadge(name) {
    return el("span", { class: `prio prio-${name}`, text: name });
  }

  function renderLevels(stats) {
    const rows = PRIORITIES.filter((name) => stats.levels[name]).map((name) => {
      const level = stats.levels[name];
      const wait = level.queue_wait_ms;
      return el("tr", { data: { priority: name } },
        el("td", { data: { col: "priority" } }, priorityBadge(name)),
        cell(fmtCount(level.depth), { num: true, col: "depth", cls: level.depth ? "" : "zero" }),
        cell(level.depth ? fmtMs(level.oldest_wait_s * 1000) : "—", { num: true, col: "oldest-wait" }),
        cell(fmtCount(level.in_flight), { num: true, col: "in-flight", cls: level.in_flight ? "" : "zero" }),
        cell(fmtMs(wait.p50), { num: true, col: "wait-p50" }),
        cell(fmtMs(wait.p99), { num: true, col: "wait-p99" }),
        cell(fmtCount(wait.count), { num: true, col: "jobs-seen", cls: wait.count ? "" : "zero" }));
    });
    document.querySelector("#levels tbody").replaceChildren(...rows);
  }

  function renderModels(stats) {
    const byModel = stats.dispatch_by_model;
    const spend = stats.spend_today_by_model_usd;
    const names = [...new Set([...Object.keys(byModel || {}), ...Object.keys(spend)])].sort();
    const recent = state.history.filter((entry) => Date.now() - entry.t <= 60000);
    const rows = names.map((name) => {
      const view = byModel ? byModel[name] : null;
      const jobs = view ? view.jobs : {};
      // A model throttled within the last minute is highlighted: that is the one to look at.
      const throttledBefore = recent.length && view ? modelThrottled(recent[0], name) : null;
      const freshThrottle = view && throttledBefore !== null && view.throttled_429 > throttledBefore;
      const inFlight = view ? fmtCount(view.in_flight) + (view.concurrency_limit ? ` / ${fmtCount(view.concurrency_limit)}` : "") : "—";
      const nameCell = el("td", { data: { col: "model" } }, el("span", { class: "mono", text: name }));
      if (view && view.paused_until) {
        nameCell.append(el("span", { class: "paused", text: `paused until ${fmtTime(view.paused_until)}` }));
      }
      return el("tr", { data: { model: name } },
        nameCell,
        cell(inFlight, { num: true, col: "in-flight", cls: view && view.in_flight ? "" : "zero" }),
        el("td", { class: "spark-col" }, view ? sparkline(name) : ""),
        cell(view ? fmtCount(view.throttled_429) : "—", { num: true, col: "throttled", cls: freshThrottle ? "alert" : view && view.throttled_429 ? "" : "zero" }),
        cell(view ? fmtCount(jobs.succeeded || 0) : "—", { num: true, col: "succeeded" }),
        cell(view ? fmtCount(jobs.retried || 0) : "—", { num: true, col: "retried" }),
        cell(view ? fmtCount(jobs.dead || 0) : "—", { num: true, col: "dead", cls: jobs.dead ? "alert" : "" }),
        cell(name in spend ? fmtUsd(spend[name]) : "—", { num: true, col: "spend", title: spend[name] }));
    });
    document.querySelector("#models tbody").replaceChildren(...rows);
    $("models-note").textContent = byModel
      ? "In flight, 429s and outcomes since the workers in this process started; spend from results seen today."
      : "No worker runs in this gateway's process: in-flight calls and 429s are on the workers' /metrics. Spend is from results seen today.";
  }

  function modelThrottled(entry, name) {
    const count = entry.throttledByModel[name];
    return count === undefined ? null : count;
  }

  function sparkline(model) {
    const w = 80;
    const h = 20;
    const points = state.history.map((entry) => [entry.t, entry.inFlight[model] ?? null]);
    const top = Math.max(1, ...points.map(([, v]) => v || 0));
    const now = Date.now();
    const span = spanMs(now);
    const x = (t) => ((t - (now - span)) / span) * (w - 2) + 1;
    const y = (v) => h - 1 - (v / top) * (h - 3);
    const root = svg("svg", { class: "spark", width: w, height: h, viewBox: `0 0 ${w} ${h}`, "aria-hidden": "true" });
    root.append(svg("line", { class: "base", x1: 0, x2: w, y1: h - 0.5, y2: h - 0.5 }));
    root.append(svg("path", { d: pathOf(points, x, y) }));
    return root;
  }

  function renderTenants(stats) {
    const entries = Object.entries(stats.budgets_today).sort(([a], [b]) => (a === "*") - (b === "*") || a.localeCompare(b));
    const rows = entries.map(([name, view]) => {
      const spent = Number(view.spent_usd);
      const budget = view.daily_budget_usd === null ? null : Number(view.daily_budget_usd);
      let used = el("span", { class: "bar-text", text: "no budget" });
      if (budget !== null) {
        const fraction = budget > 0 ? spent / budget : spent > 0 ? Infinity : 0;
        const fill = el("div", { class: `bar-fill${fraction >= 1 ? " over" : fraction >= 0.8 ? " warn" : ""}` });
        fill.style.width = `${Math.min(1, budget > 0 ? fraction : 1) * 100}%`;
        const label = budget > 0 ? `${Math.round(fraction * 100)}%` : "no spend allowed";
        used = el("div", { class: "bar-cell" }, el("div", { class: "bar" }, fill), el("span", { class: "bar-text", text: label }));
      }
      const label = name === "*" ? el("b", { text: "all tenants" }) : el("span", { class: "mono", text: name });
      return el("tr", { data: { tenant: name } },
        el("td", { data: { col: "tenant" } }, label),
        cell(fmtUsd(view.spent_usd), { num: true, col: "spent", title: view.spent_usd }),
        cell(budget === null ? "unlimited" : fmtUsd(view.daily_budget_usd), { num: true, col: "budget", cls: budget === null ? "zero" : "" }),
        el("td", { data: { col: "used" } }, used));
    });
    document.querySelector("#tenants tbody").replaceChildren(...rows);
    $("tenants-note").textContent = rows.length
      ? ""
      : "No spend recorded today. Per-tenant spend comes from the budget ledger, which workers keep when a budget is configured (and always under `tidegate up`).";
  }

  // ---------------------------------------------------------------- batches

  function renderBatches(page) {
    const batches = page.data;
    $("batches-count").textContent = page.has_more ? `the ${batches.length} most recent` : `${batches.length}`;
    const rows = batches.map((batch) => {
      const counts = batch.request_counts;
      return el("tr", { data: { batchId: batch.id } },
        cell(batch.id.slice(0, 18), { cls: "mono", col: "id", title: batch.id }),
        cell(batch.status, { col: "status" }),
        el("td", { data: { col: "priority" } }, priorityBadge(batch.priority)),
        cell(fmtCount(counts.completed), { num: true, col: "completed" }),
        cell(fmtCount(counts.failed), { num: true, col: "failed" }),
        cell(fmtCount(counts.total), { num: true, col: "total" }),
        cell(fmtTime(new Date(batch.created_at * 1000).toISOString()), { col: "created" }));
    });
    document.querySelector("#batches tbody").replaceChildren(...rows);
    $("batches-empty").hidden = batches.length > 0;
  }

  // ---------------------------------------------------------------- provider batches

  function renderProviderBatches(page) {
    const batches = page.data;
    $("provider-batches-count").textContent = page.has_more ? `the ${batches.length} most recent` : `${batches.length}`;
    const rows = batches.map((batch) => {
      const progress = batch.progress;
      // Counted over a sample of a large batch's jobs: the cells say over how many.
      const title = progress.sampled < batch.lines ? `of ${progress.sampled} jobs sampled` : undefined;
      const count = (col) => cell(fmtCount(progress[col]), { num: true, col, title });
      return el("tr", { data: { providerBatchId: batch.id } },
        cell(batch.provider, { col: "provider" }),
        cell(batch.batch_id.slice(0, 24), { cls: "mono", col: "batch", title: batch.batch_id }),
        cell(batch.model, { col: "model" }),
        cell(fmtCount(batch.lines), { num: true, col: "lines" }),
        count("waiting"), count("collected"), count("served_live"), count("cancelled"),
        cell(fmtTime(batch.submitted_at), { col: "submitted" }));
    });
    document.querySelector("#provider-batches tbody").replaceChildren(...rows);
    const empty = $("provider-batches-empty");
    empty.hidden = batches.length > 0;
    empty.textContent = page.enabled
      ? "No provider batch sent yet."
      : "No provider has a batch section: every job is served by a live call.";
  }

  // ---------------------------------------------------------------- dead letters

  function renderDlq(page, dead) {
    const jobs = page.data;
    $("dlq-count").textContent = dead > jobs.length ? `${fmtCount(dead)} in all, the ${jobs.length} most recent shown` : `${fmtCount(dead)}`;
    updateRedriveAll(dead);
    // Rebuilt only when it changed, so a button is not replaced under the pointer mid-click.
    const signature = JSON.stringify(jobs.map((job) => [job.id, job.attempts, job.last_error, job.finished_at]));
    if (signature === state.dlqSignature) return;
    state.dlqSignature = signature;
    const rows = jobs.map((job) => {
      const button = el("button", { type: "button", class: "btn small", text: "Redrive", title: `Put ${job.id} back in the queue at ${job.priority}` });
      button.addEventListener("click", () => redrive({ ids: [job.id] }, button));
      return el("tr", { data: { jobId: job.id } },
        cell(job.id.slice(0, 12), { cls: "mono", col: "id", title: job.id }),
        el("td", { data: { col: "priority" } }, priorityBadge(job.priority)),
        cell(job.tenant, { col: "tenant" }),
        cell(`${job.attempts} / ${job.max_attempts}`, { num: true, col: "attempts" }),
        cell(job.last_error || "—", { cls: "error-cell", col: "last-error", title: job.last_error || undefined }),
        cell(fmtTime(job.finished_at), { col: "finished", title: job.finished_at || undefined }),
        el("td", { class: "action-col" }, button));
    });
    document.querySelector("#dlq tbody").replaceChildren(...rows);
    $("dlq-empty").hidden = jobs.length > 0;
  }

  function updateRedriveAll(dead) {
    const button = $("redrive-all");
    const confirming = Date.now() < state.confirmAllUntil;
    button.disabled = dead === 0;
    button.classList.toggle("danger", confirming && dead > 0);
    button.textContent = confirming && dead > 0 ? `Confirm: redrive ${fmtCount(dead)}` : "Redrive all";
  }

  async function redrive(body, button) {
    button.disabled = true;
    button.textContent = "Redriving…";
    try {
      const answer = await api("v1/dlq/redrive", { method: "POST", body: JSON.stringify(body) });
      toast(`${answer.redriven} job${answer.redriven === 1 ? "" : "s"} put back in the queue`);
    } catch (exc) {
      showBanner(`Redrive failed: ${exc.message}`);
    }
    state.dlqSignature = ""; // rebuild the rows (and their buttons) even if nothing changed
    refreshNow();
  }

  function onRedriveAll() {
    const button = $("redrive-all");
    // Two clicks, no dialog: a native confirm() would block the page's updates while open.
    if (Date.now() >= state.confirmAllUntil) {
      state.confirmAllUntil = Date.now() + 4000;
      updateRedriveAll(state.stats ? state.stats.dead : 0);
      setTimeout(() => updateRedriveAll(state.stats ? state.stats.dead : 0), 4100);
      return;
    }
    state.confirmAllUntil = 0;
    redrive({ all: true }, button).finally(() => updateRedriveAll(state.stats ? state.stats.dead : 0));
  }

  // ---------------------------------------------------------------- charts

  function niceCeil(value) {
    if (!(value > 0)) return 0;
    const scale = 10 ** Math.floor(Math.log10(value));
    const fraction = value / scale;
    return (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10) * scale;
  }

  // An SVG path through [t, value] points, broken where a value is unknown. A lone point is
  // drawn as a short dash ending at it, so a first sample is visible before there is a line.
  function pathOf(points, x, y) {
    let d = "";
    let run = 0;
    for (const [t, v] of points) {
      if (v === null || v === undefined) {
        if (run === 1) d += "h-4";
        run = 0;
        continue;
      }
      d += `${run ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      run += 1;
    }
    if (run === 1) d += "h-4";
    return d;
  }

  // The charts' time span: from the first sample, at least a minute and at most HISTORY_MS, so a
  // freshly opened page draws its first minutes across the whole width.
  function spanMs(now) {
    const first = state.history.length ? state.history[0].t : now;
    return Math.min(HISTORY_MS, Math.max(60000, now - first));
  }

  function fmtSpan(ms) {
    return ms >= 60000 ? `−${+(ms / 60000).toFixed(1)} min` : `−${Math.round(ms / 1000)} s`;
  }

  // A round top for the y axis and how many grid steps divide it into round values.
  function axis(max, minTop) {
    const top = Math.max(niceCeil(max), minTop) || 1;
    const lead = Math.round(top / 10 ** Math.floor(Math.log10(top)));
    return { top, steps: lead === 2 ? 4 : 5 };
  }

  function lineChart(host, series, { format, minTop = 0 }) {
    const w = Math.max(host.clientWidth, 240);
    const h = Math.max(host.clientHeight, 120);
    const pad = { left: 58, right: 10, top: 8, bottom: 20 };
    const now = Date.now();
    const span = spanMs(now);
    const start = now - span;
    let max = 0;
    for (const s of series) for (const [, v] of s.points) if (v !== null && v !== undefined) max = Math.max(max, v);
    const { top, steps } = axis(max, minTop);
    const x = (t) => pad.left + ((t - start) / span) * (w - pad.left - pad.right);
    const y = (v) => pad.top + (1 - v / top) * (h - pad.top - pad.bottom);
    const root = svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" });
    for (let i = 0; i <= steps; i += 1) {
      const v = (top * i) / steps;
      root.append(svg("line", { class: "grid-line", x1: pad.left, x2: w - pad.right, y1: y(v), y2: y(v) }));
      const label = svg("text", { class: "axis-label", x: pad.left - 8, y: y(v) + 4, "text-anchor": "end" });
      label.textContent = format(v);
      root.append(label);
    }
    for (const [back, anchor] of [[span, "start"], [span / 2, "middle"], [0, "end"]]) {
      const label = svg("text", { class: "axis-label", x: x(now - back), y: h - 4, "text-anchor": anchor });
      label.textContent = back ? fmtSpan(back) : "now";
      root.append(label);
    }
    let drawn = 0;
    for (const s of series) {
      const d = pathOf(s.points, x, y);
      if (!d) continue;
      drawn += 1;
      root.append(svg("path", { class: `series ${s.cls}${s.dashed ? " dashed" : ""}`, d }));
    }
    if (!drawn) {
      const empty = svg("text", { class: "no-data", x: (pad.left + w) / 2, y: h / 2, "text-anchor": "middle" });
      empty.textContent = "no data yet";
      root.append(empty);
    }
    host.replaceChildren(root);
  }

  function legend(host, items) {
    host.replaceChildren(...items.map(({ cls, name, value, off }) =>
      el("span", { class: `legend-item ${cls}${off ? " off" : ""}` }, `${name} `, el("b", { text: value }))));
  }

  function lastValue(points) {
    for (let i = points.length - 1; i >= 0; i -= 1) if (points[i][1] !== null && points[i][1] !== undefined) return points[i][1];
    return null;
  }

  function renderCharts() {
    const history = state.history;
    const level = (name, field) => history.map((e) => [e.t, e.levels[name] ? e.levels[name][field] : null]);

    const depth = PRIORITIES.map((name) => ({ cls: `s-${name}`, name, points: level(name, "depth") }));
    lineChart($("chart-depth"), depth, { format: fmtCount, minTop: 5 });
    legend($("legend-depth"), depth.map((s) => ({ cls: s.cls, name: s.name, value: fmtCount(lastValue(s.points)) })));

    const wait = [];
    const waitLegend = [];
    for (const name of PRIORITIES) {
      const p50 = level(name, "p50");
      const p99 = level(name, "p99");
      wait.push({ cls: `s-${name}`, points: p99 }, { cls: `s-${name}`, points: p50, dashed: true });
      const last50 = lastValue(p50);
      const last99 = lastValue(p99);
      waitLegend.push({ cls: `s-${name}`, name, value: last99 === null ? "no jobs" : `${fmtMs(last50)} / ${fmtMs(last99)}`, off: last99 === null });
    }
    lineChart($("chart-wait"), wait, { format: fmtMs });
    legend($("legend-wait"), waitLegend);

    const flows = [{ cls: "s-seen", name: "seen by gateway", points: history.map((e) => [e.t, e.seen]) }];
    if (history.some((e) => e.succeeded !== null)) {
      flows.unshift({ cls: "s-workers", name: "completed by workers", points: history.map((e) => [e.t, e.workerRate]) });
      flows.push({ cls: "s-429", name: "429s", points: history.map((e) => [e.t, e.throttledRate]) });
    }
    lineChart($("chart-throughput"), flows, { format: fmtRate, minTop: 5 });
    legend($("legend-throughput"), flows.map((s) => ({ cls: s.cls, name: s.name, value: `${fmtRate(lastValue(s.points))} /min` })));
  }

  // ---------------------------------------------------------------- recommendations

  // A panel of its own, polled beside the queue's: GET v1/health (freshness, the most active
  // user) and the chosen user's top 10 with reasons. A gateway without a recommender answers 503;
  // the panel then says so and the rest of the page is unaffected.
  const RECS_N = 10;
  const recs = {
    user: "", // the user shown
    chosen: false, // typed by the person (else the most active user is followed)
    timer: 0,
    polling: false,
    signature: "",
  };

  function scheduleRecs(delayMs = POLL_MS) {
    clearTimeout(recs.timer);
    recs.timer = setTimeout(pollRecs, delayMs);
  }

  async function pollRecs() {
    if (recs.polling) return;
    if (state.paused || !$("login").hidden || $("main").hidden) {
      scheduleRecs();
      return;
    }
    recs.polling = true;
    try {
      const health = await api("v1/health");
      renderRecsHealth(health);
      if (!recs.chosen && health.most_active_user && health.most_active_user !== recs.user) {
        recs.user = health.most_active_user;
        if (document.activeElement !== $("recs-user")) $("recs-user").value = recs.user;
      }
      if (!recs.user) {
        setRecsStatus("No user yet: type a user id, or wait for the first interaction.");
        document.querySelector("#recs-list tbody").replaceChildren();
        recs.signature = "";
      } else {
        const user = recs.user;
        const answer = await api(`v1/recommendations/${encodeURIComponent(user)}?n=${RECS_N}&explain=true`);
        if (user === recs.user) renderRecs(answer);
      }
    } catch (exc) {
      const status = exc instanceof ApiFailure ? exc.status : 0;
      if (status === 503) {
        setRecsStatus(`Recommendations are not available on this gateway (${exc.message}).`);
        document.querySelector("#recs-list tbody").replaceChildren();
        recs.signature = "";
      } else if (status !== 401 && status !== 403) {
        setRecsStatus(`Recommendations could not be read: ${exc.message}`);
      }
    } finally {
      recs.polling = false;
      scheduleRecs();
    }
  }

  function setRecsStatus(text) {
    $("recs-status").textContent = text;
  }

  function renderRecsHealth(health) {
    const latency = health.commit_to_updated;
    const node = $("recs-latency");
    node.textContent = latency && latency.count ? fmtPair(latency.p50_ms, latency.p99_ms) : "—";
    node.title = latency
      ? `${fmtCount(latency.count)} changes measured, from the database commit to the recommender updated`
      : "No change flow runs in this gateway's process";
    $("recs-size").textContent = `${fmtCount(health.items)} / ${fmtCount(health.users)}`;
    const since = health.seconds_since_update;
    $("recs-fresh").textContent = since === null || since === undefined ? "—" : fmtAgo(since * 1000);
    $("recs-fresh").title = health.last_update_at || "";
  }

  function renderRecs(answer) {
    const items = answer.items;
    const note = answer.cold_start ? " No history for this user yet: what is trending." : "";
    setRecsStatus(`Top ${items.length} for user ${answer.user_id}, computed ${fmtTime(answer.generated_at)}.${note}`);
    const before = new Map();
    document.querySelectorAll("#recs-list tbody tr").forEach((row, index) => before.set(row.dataset.item, index));
    const signature = JSON.stringify([answer.user_id, items.map((item) => [item.item_id, item.reason])]);
    const changed = recs.signature !== "" && signature !== recs.signature;
    recs.signature = signature;
    const rows = items.map((item, index) => {
      const moved = changed && before.get(item.item_id) !== index;
      const name = el("td", { data: { col: "item" } }, el("span", { class: "mono", text: item.item_id }));
      return el("tr", { class: moved ? "changed" : undefined, data: { item: item.item_id } },
        cell(String(index + 1), { num: true, col: "rank" }),
        name,
        cell(item.score.toFixed(3), { num: true, col: "score", title: signalsText(item.signals) }),
        cell(item.reason || "—", { col: "reason" }));
    });
    document.querySelector("#recs-list tbody").replaceChildren(...rows);
  }

  function signalsText(signals) {
    return Object.entries(signals || {}).map(([name, value]) => `${name} ${Number(value).toFixed(3)}`).join(", ");
  }

  function onRecsUser(event) {
    event.preventDefault();
    const value = $("recs-user").value.trim();
    recs.chosen = value !== "";
    recs.user = value;
    recs.signature = "";
    scheduleRecs(0);
  }

  // ---------------------------------------------------------------- wiring

  function start() {
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) return;
      state.key = key;
      sessionStorage.setItem(KEY_STORAGE, key);
      $("key-input").value = "";
      $("login").hidden = true;
      refreshNow();
    });
    // A #key= pasted into the address of an open page: no reload happens, so take it here.
    window.addEventListener("hashchange", () => {
      const key = keyFromAddress();
      if (!key) return;
      state.key = key;
      $("login").hidden = true;
      refreshNow();
    });
    $("forget-key").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_STORAGE);
      window.location.reload();
    });
    $("pause").addEventListener("click", () => {
      state.paused = !state.paused;
      $("pause").textContent = state.paused ? "Resume" : "Pause";
      if (!state.paused) refreshNow();
      updateClock();
    });
    $("redrive-all").addEventListener("click", onRedriveAll);
    $("recs-form").addEventListener("submit", onRecsUser);
    let resizeTimer = 0;
    window.addEventListener("resize", () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => { if (state.stats) renderCharts(); }, 150);
    });
    setInterval(updateClock, 1000);
    poll();
    scheduleRecs(0);
  }

  start();
})();
