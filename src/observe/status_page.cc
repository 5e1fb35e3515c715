#include "atoll/observe/status_page.h"

namespace atl::observe {
namespace {

// The page. Its data comes from api/history once, then api/status every second. Element ids the
// tests look for: #run, #rounds, #learners (tbody rows learner-<id>),
// #events, #loss-chart, #bytes-chart, #error, #holding, #rebuilt.
constexpr char kPage[] = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>atoll syncer</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#111;background:#fafafa}
h1{font-size:20px;margin:0 0 .3em} h2{font-size:15px;margin:1.2em 0 .4em}
.cards{display:flex;flex-wrap:wrap;gap:.6em}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.5em .8em;min-width:9em}
.card b{display:block;font-size:18px}
table{border-collapse:collapse;background:#fff} td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f0f0f0} td:nth-child(2){text-align:left}
.training{color:#176d2c}.silent{color:#b00020;font-weight:bold}.done{color:#555}.joining{color:#a05a00}
#error,#holding,#rebuilt{color:#b00020} #holding{font-weight:bold} #events{max-height:12em;overflow:auto;background:#fff;border:1px solid #ddd;padding:.3em .8em}
svg{background:#fff;border:1px solid #ddd} .muted{color:#666}
</style></head><body>
<h1>atoll syncer <span id="run" class="muted"></span></h1>
<div id="error"></div>
<div id="holding"></div>
<div id="rebuilt"></div>
<div class="cards">
 <div class="card">rounds<b id="rounds">–</b></div>
 <div class="card">live learners<b id="live">–</b></div>
 <div class="card">global eval loss<b id="eval">–</b></div>
 <div class="card">goodput (merged / trained)<b id="goodput">–</b></div>
 <div class="card">uptime<b id="uptime">–</b></div>
 <div class="card">on the wire<b id="wire">–</b></div>
 <div class="card">data-parallel would move<b id="dp">–</b></div>
</div>
<h2>Learners</h2>
<table><thead><tr><th>learner</th><th>state</th><th>step</th><th>tokens/s</th><th>loss</th><th>version held</th>
<th>rounds joined</th><th>tokens merged</th><th>last seen</th><th>joins</th></tr></thead><tbody id="learners"></tbody></table>
<h2>Loss</h2><svg id="loss-chart" width="640" height="300"></svg>
<h2>Bytes on the wire vs data-parallel</h2><svg id="bytes-chart" width="640" height="300"></svg>
<h2>Timeline <span class="muted">(learner state changes and restarts seen since this page opened)</span></h2>
<div id="events"></div>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
const headers = token ? {Authorization: "Bearer " + token} : {};
const hist = {learners: {}, bytes: [], prev: {}, uptime: -1};
const colors = ["#1f77b4","#d62728","#2ca02c","#9467bd","#ff7f0e","#8c564b","#e377c2","#17becf"];
const $ = id => document.getElementById(id);
function num(v, d) { return typeof v === "number" && isFinite(v) ? v.toFixed(d) : "–"; }
function grouped(v) { return typeof v === "number" ? Math.round(v).toLocaleString("en-US") : "–"; }
function bytes(b) { const u = ["B","KB","MB","GB","TB"]; let i = 0; while (b >= 1000 && i < 4) { b /= 1000; i++; } return b.toFixed(1) + " " + u[i]; }
function dur(s) { s = Math.round(s); const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60); return (h ? h + "h " : "") + (h || m ? m + "m " : "") + s % 60 + "s"; }
function event(t, text) { const d = document.createElement("div"); d.textContent = "t=" + dur(t) + "  " + text; $("events").prepend(d); }
function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); }
function stateOf(l, live) { return l.state === "done" ? "done" : (live.has(l.id) ? l.state : "silent"); }
function renderTable(s, live) {
  const body = $("learners"); body.textContent = "";
  for (const l of s.learners) {
    const tr = document.createElement("tr"); tr.id = "learner-" + l.id; const st = stateOf(l, live);
    cell(tr, String(l.id)); cell(tr, st, st); cell(tr, grouped(l.step)); cell(tr, grouped(l.tokens_per_second));
    cell(tr, num(l.loss, 4)); cell(tr, String(l.version_held)); cell(tr, grouped(l.rounds_joined));
    cell(tr, grouped(l.tokens_merged)); cell(tr, num(l.seconds_since_seen, 1) + " s ago"); cell(tr, String(l.joins));
    body.appendChild(tr);
  }
}
function track(s, live, t) {
  if (hist.uptime >= 0 && s.uptime_s < hist.uptime) event(t, "the syncer restarted (from its durable state)");
  hist.uptime = s.uptime_s;
  for (const l of s.learners) {
    const st = stateOf(l, live), p = hist.prev[l.id];
    if (!p) event(t, "learner " + l.id + " appears (" + st + ")");
    else if (p.state !== st) event(t, "learner " + l.id + ": " + p.state + " → " + st);
    if (p && l.joins > p.joins) event(t, "learner " + l.id + " rejoined (join " + l.joins + ")");
    hist.prev[l.id] = {state: st, joins: l.joins};
    if (l.loss > 0) (hist.learners[l.id] = hist.learners[l.id] || []).push([t, l.loss]);
  }
  hist.bytes.push([t, s.bytes_up + s.bytes_down, s.dp_equivalent_bytes]);
}
function svgEl(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]); if (text !== undefined) e.textContent = text; return e;
}
function ticks(lo, hi, log) {
  if (!log) return [0, 1, 2, 3, 4].map(i => lo + (hi - lo) * i / 4);
  const out = []; for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) if (e >= lo && e <= hi) out.push(e); return out.length ? out : [lo, hi];
}
function chart(svg, series, xlabel, ylabel, fmt, log) {
  svg.textContent = ""; const W = 640, H = 300, L = 70, R = 150, T = 24, B = 40;
  const f = v => log ? Math.log10(Math.max(v, 1)) : v;
  const pts = series.flatMap(s => s.pts); if (!pts.length) { svg.appendChild(svgEl("text", {x: 20, y: 30}, "no data yet")); return; }
  let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  let y0 = Math.min(...pts.map(p => f(p[1]))), y1 = Math.max(...pts.map(p => f(p[1])));
  if (x1 === x0) x1 = x0 + 1; if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R), Y = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const xfmt = x1 - x0 < 20 ? (v => v.toFixed(1) + "s") : dur;
  svg.appendChild(svgEl("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#333"}));
  for (const yv of ticks(y0, y1, log)) svg.appendChild(svgEl("text", {x: L - 4, y: Y(yv) + 4, "text-anchor": "end", "font-size": 11}, fmt(log ? Math.pow(10, yv) : yv)));
  for (let i = 0; i <= 4; i++) { const xv = x0 + (x1 - x0) * i / 4; svg.appendChild(svgEl("text", {x: X(xv), y: H - B + 14, "text-anchor": "middle", "font-size": 11}, xfmt(xv))); }
  svg.appendChild(svgEl("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", "font-size": 12}, xlabel));
  svg.appendChild(svgEl("text", {x: 4, y: 14, "font-size": 12}, ylabel + (log ? " (log scale)" : "")));
  series.forEach((s, i) => {
    if (!s.pts.length) return;
    const d = s.pts.map((p, j) => (j ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(f(p[1])).toFixed(1)).join(" ");
    svg.appendChild(svgEl("path", {d: d, fill: "none", stroke: s.color, "stroke-width": 2, "stroke-dasharray": s.dash || ""}));
    svg.appendChild(svgEl("text", {x: W - R + 8, y: T + 14 + 16 * i, fill: s.color, "font-size": 12}, s.name));
  });
}
function render(s) {
  const now = s.now, start = now - s.uptime_s, t = s.uptime_s, live = new Set(s.live);
  $("run").textContent = s.run_id + " · " + s.mode + " · " + s.fragments + " fragments · " + grouped(s.params) + " params";
  $("holding").textContent = s.holding ? "holding rounds: " + s.holding : "";
  const rb = s.rebuilt;
  $("rebuilt").textContent = !rb ? "" : "rebuilt from the learners' copies: " + rb.adopted.map(a => "f" + a.fragment + " v" + a.version + " (learner " + a.learner + ")").join(", ") + (rb.adopted.length ? "" : "none adopted yet") + "; outer momentum and the learner table's accounting reset" + (rb.rebuilding ? " · adopting copies, rounds start in " + num(rb.seconds_left, 1) + " s" : "");
  $("rounds").textContent = grouped(s.rounds); $("live").textContent = s.live.length + " of " + s.learners.length;
  $("eval").textContent = s.global_eval_loss !== undefined ? num(s.global_eval_loss, 4) + " (from " + num(s.eval_loss_start, 4) + ")" : "not yet (start " + num(s.eval_loss_start, 4) + ")";
  $("goodput").textContent = num(s.goodput, 3); $("uptime").textContent = dur(s.uptime_s);
  $("wire").textContent = bytes(s.bytes_up + s.bytes_down) + " (up " + bytes(s.bytes_up) + ")";
  $("dp").textContent = bytes(s.dp_equivalent_bytes) + (s.bytes_up + s.bytes_down > 0 ? " (" + (s.dp_equivalent_bytes / (s.bytes_up + s.bytes_down)).toFixed(1) + "x)" : "");
  track(s, live, t); renderTable(s, live);
  const loss = Object.keys(hist.learners).map((id, i) => ({name: "learner " + id + " (train)", color: colors[i % colors.length], pts: hist.learners[id]}));
  loss.push({name: "global (eval)", color: "#000", dash: "6 3", pts: (s.global_eval_curve || []).map(e => [e.t - start, e.eval_loss])});
  chart($("loss-chart"), loss, "time since the syncer started", "loss (nats/token)", v => v.toFixed(2));
  chart($("bytes-chart"), [{name: "atoll (up + down)", color: colors[0], pts: hist.bytes.map(b => [b[0], b[1]])},
                           {name: "data-parallel", color: colors[1], dash: "6 3", pts: hist.bytes.map(b => [b[0], b[2]])}],
        "time since the syncer started", "bytes", bytes, true);
}
// The run so far (sampled every 2 s by the syncer), so a page opened late shows it from the start.
async function loadHistory() {
  try {
    const r = await fetch("api/history", {headers: headers, cache: "no-store"});
    if (!r.ok) return;
    for (const p of (await r.json()).points) {
      for (const id in p.learners) if (p.learners[id].loss > 0) (hist.learners[id] = hist.learners[id] || []).push([p.t, p.learners[id].loss]);
      hist.bytes.push([p.t, p.wire_bytes, p.dp_equivalent_bytes]);
    }
  } catch (e) { /* the live polls report errors */ }
}
async function poll() {
  try {
    const r = await fetch("api/status", {headers: headers, cache: "no-store"});
    if (!r.ok) throw new Error(r.status + " " + (await r.text()));
    render(await r.json()); $("error").textContent = "";
  } catch (e) { $("error").textContent = "cannot read the syncer's status: " + e.message; }
  setTimeout(poll, 1000);
}
loadHistory().then(poll);
</script></body></html>
)html";

}  // namespace

std::string_view StatusPageHtml() { return {kPage, sizeof(kPage) - 1}; }

}  // namespace atl::observe
