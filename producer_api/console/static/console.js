// Conveyor console: one EventSource on /console/stream updates whichever page is open.
// Job content is only ever set through textContent, never HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

// Where the console is, as the browser reaches it: `/console` under the path prefix a proxy in
// front strips (the page's `data-base`, computed once by the producer), or a feed and its links
// led out of the prefix.
function home(path = "") {
  return `${document.body.dataset.base || ""}/console${path}`;
}

function cell(row, field) {
  return row.querySelector(`[data-field="${field}"]`);
}

function setText(node, value) {
  if (node && node.textContent !== String(value)) node.textContent = String(value);
}

function dash(value) {
  return value === null || value === undefined ? "–" : value;
}

function sparkline(svg, values) {
  const line = svg.querySelector("polyline");
  if (!line || values.length === 0) return;
  const top = Math.max(...values) || 1;
  const step = 120 / Math.max(1, values.length - 1);
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(22 - (v / top) * 20).toFixed(1)}`);
  line.setAttribute("points", points.join(" "));
}

function renderPartitions(partitions) {
  for (const p of partitions) {
    const row = document.querySelector(`tr[data-partition="${CSS.escape(p.id)}"]`);
    if (!row) continue;
    setText(cell(row, "online.length"), p.online.length);
    setText(cell(row, "bulk.length"), p.bulk.length);
    setText(cell(row, "lag"), p.online.lag + p.bulk.lag);
    setText(cell(row, "pending"), p.online.pending + p.bulk.pending);
    setText(cell(row, "oldest"), `${Math.max(p.online.oldest_age_s, p.bulk.oldest_age_s).toFixed(1)} s`);
    setText(cell(row, "dlq"), p.dlq);
    setText(cell(row, "rate"), p.rate_per_s);
    setText(cell(row, "p50"), dash(p.p50_ms));
    setText(cell(row, "p99"), dash(p.p99_ms));
    sparkline(cell(row, "spark"), p.history);
    sparkline(cell(row, "throughput"), p.throughput);
  }
}

function row(values, className) {
  const tr = document.createElement("tr");
  for (const value of values) {
    const td = document.createElement("td");
    if (value instanceof Node) td.appendChild(value);
    else td.textContent = String(value);
    tr.appendChild(td);
  }
  if (className) tr.className = className;
  return tr;
}

function badge(text, kind) {
  const span = document.createElement("span");
  span.className = `${kind} ${text}`;
  span.textContent = text;
  return span;
}

function replaceRows(tbody, rows, empty, columns) {
  tbody.replaceChildren(...(rows.length ? rows : [row([empty], "empty")]));
  if (!rows.length) tbody.firstChild.firstChild.colSpan = columns;
}

function renderWorkers(workers, at) {
  const tbody = document.querySelector("#workers tbody");
  if (!tbody) return;
  const rows = workers.map((w) => {
    const tr = row([w.name, badge(w.state, "state"), w.models.join(", "), w.engines.join(", "),
      `${w.host} / ${w.pid}`, w.batch_size, w.jobs_done, `${Math.max(0, at - w.last_beat).toFixed(0)} s ago`]);
    for (const i of [5, 6, 7]) tr.children[i].className = "num";
    return tr;
  });
  replaceRows(tbody, rows, "No live workers.", 8);
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

function renderBatches(batches, total) {
  const tbody = document.querySelector("#batches tbody");
  if (!tbody) return;
  setText(document.getElementById("batches-cut"),
    total > batches.length ? `The newest ${batches.length} of ${total} shown.` : "");
  const rows = batches.map((b) => {
    const done = b.counts.succeeded + b.counts.failed;
    const bar = document.createElement("span");
    const progress = document.createElement("progress");
    progress.max = b.counts.total || 1;
    progress.value = done;
    const pct = document.createElement("span");
    pct.className = "pct";
    pct.textContent = ` ${Math.floor((done * 100) / (b.counts.total || 1))}%`;
    bar.append(progress, pct);
    // A file is linked once the batch has ended with a line in it (its `*_file_id`): before
    // then its download answers 409.
    const files = document.createElement("span");
    const kinds = [["output", b.output_file_id], ["errors", b.error_file_id]].filter(([, id]) => id);
    kinds.forEach(([kind], i) => {
      if (i) files.append(" · ");
      files.append(link(home(`/batches/${encodeURIComponent(b.id)}/${kind}`), kind));
    });
    if (!kinds.length) files.textContent = "–";
    const tr = row([b.id, b.status, bar, b.counts.succeeded, b.counts.failed, b.counts.total, files]);
    tr.dataset.batch = b.id;
    tr.children[0].className = "mono";
    for (const i of [3, 4, 5]) tr.children[i].className = "num";
    return tr;
  });
  replaceRows(tbody, rows, "No batches running.", 7);
}

function localTimes() {
  for (const node of document.querySelectorAll(".time[data-ms], .time[data-s]")) {
    const ms = node.dataset.ms ? Number(node.dataset.ms) : Number(node.dataset.s) * 1000;
    if (ms) node.textContent = new Date(ms).toLocaleString();
  }
}

// The dot is green while summaries come (one a second). A producer that cannot reach Redis
// sends none over a stream still open: the dot turns `stale` rather than stay green over
// figures that no longer move.
const STALE_MS = 3000;

function watchStaleness(live) {
  let last = Date.now();
  setInterval(() => {
    const stale = Date.now() - last > STALE_MS;
    live.classList.toggle("stale", stale);
    if (stale) live.classList.remove("on");
    live.title = stale ? `no update for ${Math.round((Date.now() - last) / 1000)} s` : "live updates";
  }, 1000);
  return () => {
    last = Date.now();
    live.classList.remove("stale");
    live.classList.add("on");
  };
}

function render(summary) {
  renderPartitions(summary.partitions);
  renderWorkers(summary.workers, summary.at);
  renderBatches(summary.batches, summary.batches_total);
  document.body.dataset.updated = String(summary.at);
}

// EventSource reconnects by itself to a dropped stream, but gives up for good on an answer that
// is not one (a 503 while the producer cannot reach Redis, a proxy's 502 while it restarts): the
// page then opens a new one, waiting twice as long after each failure, up to REOPEN_MAX_MS.
const REOPEN_MS = 1000;
const REOPEN_MAX_MS = 30000;

// A feed ends with its session (logged out, the key revoked, expired) and its reconnect is sent
// to the login page, which EventSource takes for a failure: the page sent its viewer there
// rather than retry for good over figures gone stale.
async function sessionEnded() {
  try {
    const answer = await fetch(location.href, { redirect: "manual", cache: "no-store" });
    return answer.type === "opaqueredirect";
  } catch {
    return false;  // the producer unreachable: retried as any failure
  }
}

// A hidden page's feed is closed, and opened again when the page is shown: a tab left in the
// background held its place among its key's open streams (the cap its API clients' event
// streams share) and a server task for figures no one saw, for as long as it stayed open.
function follow() {
  const live = document.getElementById("live");
  const page = document.body.dataset.page;
  if (!live || !["overview", "workers", "batches"].includes(page)) return;
  const arrived = watchStaleness(live);
  let wait = REOPEN_MS;
  let current = null;
  let reopen = null;
  const open = () => {
    reopen = null;
    const source = new EventSource(home("/stream"));
    current = source;
    source.addEventListener("summary", (event) => {
      arrived();
      wait = REOPEN_MS;
      render(JSON.parse(event.data));
    });
    source.addEventListener("error", async () => {
      live.classList.remove("on");
      if (source.readyState !== EventSource.CLOSED) return;
      if (await sessionEnded()) {
        location.assign(home("/login"));
        return;
      }
      if (current !== source) return;  // closed meanwhile: the page was hidden
      reopen = setTimeout(open, wait);
      wait = Math.min(wait * 2, REOPEN_MAX_MS);
    });
  };
  const close = () => {
    current?.close();
    current = null;
    clearTimeout(reopen);
    reopen = null;
  };
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) close();
    else if (!current) open();
  });
  if (!document.hidden) open();
}

// An LLM job's page: its tokens as they are generated, then how it ended.
function followTokens() {
  const view = document.getElementById("job-tokens");
  if (!view) return;
  const count = document.getElementById("token-count");
  const source = new EventSource(home(`/jobs/${encodeURIComponent(view.dataset.job)}/tokens`));
  let tokens = 0;
  source.addEventListener("token", (event) => {
    const data = JSON.parse(event.data);
    view.append(document.createTextNode(data.text));
    tokens += data.tokens;
    count.textContent = `${tokens} tokens`;
  });
  source.addEventListener("restart", () => { view.textContent = ""; tokens = 0; });
  source.addEventListener("final", (event) => {
    const data = JSON.parse(event.data);
    count.textContent = `${tokens} tokens · ${data.status}${data.finish_reason ? ` (${data.finish_reason})` : ""}`;
    source.close();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes();
  follow();
  followTokens();
});
