// The paramserver dashboard: polls /api/state (the numbers /metrics serves) and draws them
// as SVG.  No library, no build step; every chart's numbers are in data- attributes too.
// Every value the page shows comes from the cluster (addresses, names, events a node sent):
// it is written as text (textContent, text nodes, setAttribute), never parsed as HTML, so a
// node registering as ipc:///tmp/<img onerror=...> shows that string and runs nothing.
// No markup is ever assigned or written: build nodes with el() (SVG) or html().
"use strict";

const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#3b6fd8", "#e07b24", "#2f8f4e", "#9b4dca", "#c7354f", "#138a96", "#8a6d1d", "#5d6b82"];
const POLL_MS = 1000;
// a cluster with a secret asks for its token: the URL the cluster printed carries it
const TOKEN = new URLSearchParams(location.search).get("token");
const QUERY = TOKEN ? "?token=" + encodeURIComponent(TOKEN) : "";

function el(tag, attrs, parent, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

// an HTML element: html("td", {class: "x"}, "text", otherNode); strings become text nodes
function html(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  node.append(...children.map(c => (c instanceof Node ? c : String(c ?? ""))));
  return node;
}

// a legend entry: a colour swatch, then the text
function swatch(color, text) {
  const i = html("i");
  i.style.background = color;
  return [i, text];
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

function fmt(x) {
  if (x >= 1e9) return (x / 1e9).toFixed(2) + "G";
  if (x >= 1e6) return (x / 1e6).toFixed(2) + "M";
  if (x >= 1e4) return (x / 1e3).toFixed(1) + "k";
  return Math.round(x).toString();
}

function colorOf(servers, id) { return COLORS[Math.max(0, servers.indexOf(id)) % COLORS.length]; }

function drawThroughput(history) {
  const svg = document.getElementById("throughput");
  clear(svg);
  const series = [["examples_per_s", "examples/s", "#2f8f4e"], ["push_keys_per_s", "push keys/s", "#3b6fd8"],
                  ["pull_keys_per_s", "pull keys/s", "#e07b24"]];
  const W = 800, H = 200, pad = 4;
  const max = Math.max(1, ...history.flatMap(h => series.map(([k]) => h[k] || 0)));
  const t0 = history.length ? history[0].at : 0, t1 = history.length ? history[history.length - 1].at : 1;
  const x = t => pad + (W - 2 * pad) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = v => H - pad - (H - 2 * pad) * v / max;
  el("text", {x: 6, y: 14, class: "axis"}, svg, fmt(max) + "/s");
  const legend = document.getElementById("throughput-legend");
  clear(legend);
  for (const [key, label, color] of series) {
    const pts = history.map(h => `${x(h.at).toFixed(1)},${y(h[key] || 0).toFixed(1)}`).join(" ");
    el("polyline", {points: pts, fill: "none", stroke: color, "stroke-width": 2, "data-series": key}, svg);
    for (const h of history.slice(-1)) el("circle", {cx: x(h.at), cy: y(h[key] || 0), r: 3, fill: color}, svg);
    const last = history.length ? history[history.length - 1][key] || 0 : 0;
    const span = document.createElement("span");
    span.id = "rate-" + key;
    span.dataset.value = last;
    span.append(...swatch(color, `${label} ${fmt(last)}`));
    legend.appendChild(span);
  }
}

function drawServers(servers, ring) {
  const svg = document.getElementById("servers");
  clear(svg);
  const metrics = [["keys", "keys"], ["rss_bytes", "memory"], ["keys_per_s", "load"]];
  const n = Math.max(1, servers.length), W = 400, H = 200, band = (W - 20) / n;
  metrics.forEach(([key, label], m) => {
    const max = Math.max(1, ...servers.map(s => s[key] || 0));
    servers.forEach((s, i) => {
      const h = 150 * (s[key] || 0) / max, bw = band / 4;
      const x0 = 10 + i * band + m * bw + bw / 2;
      el("rect", {x: x0, y: 170 - h, width: bw - 2, height: h, fill: s.hot && key === "keys_per_s" ? "#b3261e" :
        colorOf(ring.servers || [], s.id), opacity: [1, .65, .4][m], class: "bar", "data-server": s.id,
        "data-metric": key, "data-value": s[key] || 0}, svg).appendChild(el("title", {}, null,
        `server ${s.id} ${label}: ${fmt(s[key] || 0)}`));
    });
  });
  servers.forEach((s, i) => el("text", {x: 10 + i * band + band / 2, y: 188, "text-anchor": "middle", class: "axis"},
    svg, `server ${s.id}${s.hot ? " (hot)" : ""}`));
  el("text", {x: 396, y: 12, "text-anchor": "end", class: "axis"}, svg,
    "bars: keys, memory, load (keys/s), each against its largest");
  fillTable("#server-table tbody", servers, s => ["server" + (s.hot ? " hot" : ""),
    {id: s.id, keys: s.keys, pushKeys: s.push_keys, pullKeys: s.pull_keys},
    [[`${s.id} `, html("small", {}, s.address)], s.keys, (s.rss_bytes / 1048576).toFixed(0), fmt(s.keys_per_s || 0),
     s.vnodes]]);
}

// one row an item: row(item) gives [class, data- attributes, cells]; cells are text, never HTML
function fillTable(selector, items, row) {
  const body = document.querySelector(selector);
  clear(body);
  for (const item of items) {
    const [cls, data, cells] = row(item);
    const tr = document.createElement("tr");
    tr.className = cls;
    Object.assign(tr.dataset, data);
    // a cell is a value (shown as text) or a list of text and nodes
    for (const c of cells) tr.appendChild(html("td", {}, ...(Array.isArray(c) ? c : [c])));
    body.appendChild(tr);
  }
}

function drawRing(ring) {
  const svg = document.getElementById("ring");
  clear(svg);
  const owners = ring.owners || [], servers = ring.servers || [];
  const n = owners.length, cx = 100, cy = 100, r0 = 60, r1 = 90;
  owners.forEach((owner, v) => {
    const a0 = 2 * Math.PI * v / n - Math.PI / 2, a1 = 2 * Math.PI * (v + 1) / n - Math.PI / 2;
    const p = (r, a) => `${(cx + r * Math.cos(a)).toFixed(2)},${(cy + r * Math.sin(a)).toFixed(2)}`;
    el("path", {d: `M${p(r0, a0)} L${p(r1, a0)} A${r1},${r1} 0 0 1 ${p(r1, a1)} L${p(r0, a1)} ` +
      `A${r0},${r0} 0 0 0 ${p(r0, a0)} Z`, fill: colorOf(servers, owner), stroke: "#fff", "stroke-width": .3,
      class: "vnode", "data-vnode": v, "data-server": owner}, svg);
  });
  el("text", {x: cx, y: cy + 4, "text-anchor": "middle", class: "axis"}, svg, `${n} vnodes`);
  document.getElementById("ring-version").textContent = ring.version ? `version ${ring.version}` : "";
  const legend = document.getElementById("ring-legend");
  clear(legend);
  for (const s of servers) {
    const span = document.createElement("span");
    span.className = "ring-server";
    span.dataset.server = s;
    span.dataset.vnodes = (ring.vnodes || {})[s] || 0;
    span.append(...swatch(colorOf(servers, s), `server ${s}: ${span.dataset.vnodes} vnodes`));
    legend.appendChild(span);
  }
  document.getElementById("moves").textContent = ring.migrating
    ? `vnodes moving now (${ring.queued_changes || 0} change(s) queued)`
    : `no vnode moving; ${ring.moves || 0} ring change(s) so far`;
}

function drawStaleness(bins) {
  const svg = document.getElementById("staleness");
  clear(svg);
  const max = Math.max(1, ...bins.map(b => b.count));
  const band = 380 / Math.max(1, bins.length);
  bins.forEach((b, i) => {
    const h = 120 * b.count / max;
    el("rect", {x: 10 + i * band + 2, y: 135 - h, width: band - 4, height: h, fill: "#3b6fd8", class: "bucket",
      "data-staleness": b.label, "data-count": b.count}, svg).appendChild(el("title", {}, null,
      `${b.label} clocks: ${b.count} pulls`));
    el("text", {x: 10 + i * band + band / 2, y: 150, "text-anchor": "middle", class: "axis"}, svg, b.label);
    if (b.count) el("text", {x: 10 + i * band + band / 2, y: 131 - h, "text-anchor": "middle", class: "axis"}, svg,
      fmt(b.count));
  });
}

function drawWorkers(workers, job) {
  fillTable("#workers tbody", workers, w => ["worker" + (w.straggler ? " straggler" : ""),
    {id: w.id, examples: w.examples},
    [w.id, w.rank ?? "—", fmt(w.examples), fmt(w.examples_per_s || 0), w.shards_done,
     w.straggler ? [html("span", {class: "tag"}, "straggler")] : (w.alive ? "" : "gone")]]);
  const p = document.getElementById("job");
  const where = job && job.stream ? `stream ${job.stream.source}${job.stream.closed ? " (closed)" : ""}: ` :
    job ? `epoch ${job.epoch + 1}/${job.epochs}: ` : "";
  p.textContent = job && job.shards !== undefined
    ? `${where}shards ${job.shards_done}/${job.shards} done, ${job.running} running, ` +
      `${job.shards_queued} queued${job.finished ? " — finished" : ""}`
    : "no job";
  drawProgressive(job && job.progressive);
}

// progressive validation: each example scored before the model trained on it, by window, and the trend
function drawProgressive(pv) {
  const p = document.getElementById("progressive");
  if (!pv) { p.textContent = ""; return; }
  const num = x => (x === null ? "–" : x.toFixed(4));
  const one = (label, w) => w.examples
    ? `${label}: log loss ${num(w.logloss)}, AUC ${num(w.auc)} (${fmt(w.examples)} examples)` : "";
  const t = pv.trend, sign = x => (x >= 0 ? "+" : "") + x.toFixed(4);
  p.textContent = ["progressive validation — " + one(`last ${fmt(pv.window_examples.size)} examples`,
    pv.window_examples), one(`last ${pv.window_seconds.size} s`, pv.window_seconds), one("whole run", pv.all),
    t.logloss !== null && t.auc !== null ? `trend: log loss ${sign(t.logloss)}, AUC ${sign(t.auc)}` : ""]
    .filter(x => x).join(" · ");
}

function drawEvents(events, job) {
  const list = document.getElementById("events");
  clear(list);
  const items = events.map(e => ({at: e.at, what: e.what, failure: e.failure}));
  for (const f of (job && job.failovers) || []) items.push({at: f.at || 0, what: `failover: ${JSON.stringify(f)}`,
    failure: true});
  for (const l of (job && job.losses) || []) items.push({at: l.at || 0, what: `data lost: ${JSON.stringify(l)}`,
    failure: true});
  items.sort((a, b) => b.at - a.at);
  for (const e of items.slice(0, 20)) {
    const li = document.createElement("li");
    li.className = e.failure ? "failure" : "";
    li.textContent = `${e.at ? new Date(e.at * 1000).toLocaleTimeString() : ""} ${e.what}`;
    list.appendChild(li);
  }
}

async function poll() {
  const state = document.getElementById("state");
  try {
    const response = await fetch("api/state" + QUERY, {cache: "no-store"});
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const s = await response.json();
    state.textContent = s.state;
    state.className = "state " + s.state;
    document.getElementById("summary").textContent = s.state === "running"
      ? `${s.servers.length} server(s), ${s.workers.length} worker(s), ${fmt(s.totals.examples || 0)} examples` +
        (s.totals.wire_bytes_in ? `, filters: ${fmt(s.totals.wire_bytes_in)} → ${fmt(s.totals.wire_bytes_out)} bytes ` +
          `(${(s.totals.wire_bytes_in / Math.max(1, s.totals.wire_bytes_out)).toFixed(1)}x fewer)` : "") : "";
    drawThroughput(s.history || []);
    drawServers(s.servers, s.ring);
    drawRing(s.ring);
    drawStaleness(s.staleness || []);
    drawWorkers(s.workers, s.job);
    drawEvents(s.events || [], s.job);
    document.body.dataset.updated = s.at;
  } catch (err) {
    state.textContent = "unreachable: " + err.message;
    state.className = "state down";
  }
  setTimeout(poll, POLL_MS);
}

document.querySelector("header a").href = "metrics" + QUERY;
poll();
