// Electra dashboard: renders the node's frames (server-sent events, one per second). Read-only.
"use strict";

const $ = (id) => document.getElementById(id);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const secs = (a, b) => (a != null && b != null) ? ((b - a) / 1000).toFixed(1) + " s" : "–";
const clock = (ms) => ms ? new Date(ms).toLocaleTimeString() : "–";
const KEEP = 300;  // points per chart

const series = {t: [], hb: [], commits: [], live: [], down: [], none: []};

function chart(el, labels, colors) {
  const opts = {width: Math.max(300, el.clientWidth || 500), height: 180, legend: {live: true},
    series: [{}, ...labels.map((label, i) => ({label, stroke: colors[i], width: 2, spanGaps: true}))],
    axes: [{}, {size: 50}],
    // at least the last minute on the x axis, so a first point is not drawn across years
    scales: {x: {time: true, range: (u, min, max) => {
      if (!series.t.length) return [min, max];
      const last = series.t[series.t.length - 1];
      return [Math.min(series.t[0], last - 60), last];
    }}}};
  return new uPlot(opts, [[], ...labels.map(() => [])], el);
}
const rates = chart($("chart-rates"), ["heartbeats/s", "commits/s"], ["#2859c5", "#8a4bd6"]);
const fleetChart = chart($("chart-fleet"), ["live master", "master down", "no master"], ["#2e9d5b", "#d99a1e", "#b33a3a"]);

function addSample(s) {
  if (series.t.length && s.t / 1000 <= series.t[series.t.length - 1]) return;  // already drawn
  series.t.push(s.t / 1000); series.hb.push(s.heartbeats_per_s); series.commits.push(s.commits_per_s);
  series.live.push(s.live_master); series.down.push(s.master_down); series.none.push(s.no_master);
  for (const k in series) if (series[k].length > KEEP) series[k].shift();
}
function redraw() {
  rates.setData([series.t, series.hb, series.commits]);
  fleetChart.setData([series.t, series.live, series.down, series.none]);
}

const seenFailovers = new Set();
function renderFailovers(list) {
  const body = $("failovers").tBodies[0];
  if (!list.length) return;
  const rows = list.slice().reverse().map((f) => {
    const key = f.set + "@" + f.index;
    const fresh = !seenFailovers.has(key);
    seenFailovers.add(key);
    const a = f.lost_ms != null && f.detected_ms != null ? Math.max(0, f.detected_ms - f.lost_ms) : 0;
    const b = f.detected_ms != null && f.committed_ms != null ? Math.max(0, f.committed_ms - f.detected_ms) : 0;
    const px = (ms) => Math.min(300, Math.round(ms / 100));  // 1 px per 100 ms
    const master = f.elected ? `${esc(f.old ?? "none")} &rarr; ${esc(f.new)}` : `${esc(f.old ?? "none")} &rarr; <b>none elected</b>`;
    return `<tr class="${fresh ? "new" : ""}" data-set="${esc(f.set)}" data-old="${esc(f.old)}" data-new="${esc(f.new)}">
      <td>${f.committed_ms ? clock(f.committed_ms) : "replayed"}</td>
      <td><a href="#set=${encodeURIComponent(f.set)}">${esc(f.set)}</a></td><td>${master}</td><td>${esc(f.epoch)}</td>
      <td>${secs(f.lost_ms, f.detected_ms)}</td><td>${secs(f.detected_ms, f.committed_ms)}</td>
      <td>${secs(f.lost_ms ?? f.detected_ms, f.committed_ms)}</td>
      <td><span class="bar"><span class="lost" style="width:${px(a)}px"></span><span class="commit" style="width:${px(b)}px"></span></span></td></tr>`;
  });
  body.innerHTML = rows.join("");
}

function renderGroup(g) {
  $("leader-changes").textContent = `leader ${g.leader_id || "unknown"}; leader changes seen here: ${g.leader_changes_seen_here}`;
  $("group").tBodies[0].innerHTML = g.nodes.map((n) => n.reachable
    ? `<tr data-node="${esc(n.id)}"><td>${esc(n.id)} <small>${esc(n.endpoint)}</small></td><td>${esc(n.role)}</td><td>${esc(n.term)}</td>
       <td>${esc(n.commit_index)}</td><td>${esc(n.applied_index)}</td><td>${esc(n.snapshot_index)}</td><td>${esc(n.lag)}</td></tr>`
    : `<tr data-node="${esc(n.id)}"><td>${esc(n.id)} <small>${esc(n.endpoint)}</small></td><td colspan="6" class="na">unreachable (${esc(n.error)})</td></tr>`).join("");
}

function renderPipeline(p, tier) {
  const fmt = (v) => v == null ? "–" : esc(v);  // every value escaped: what reaches this page is data, never markup
  const rows = [["Kafka pipeline", p.kafka ? "on" : "off (heartbeats go to the controllers)"],
    ["heartbeats/s", `${fmt(p.heartbeats_per_s)} <small>${esc(p.heartbeats_note)}</small>`]];
  if (p.dead_letters_total != null) rows.push(["dead letters (all time)", fmt(p.dead_letters_total)]);
  if (p.spark_batch) {
    const b = p.spark_batch;
    rows.push(["Spark batch", `#${fmt(b.batchId)}: ${fmt(b.rows)} rows in ${fmt(b.batchMs)} ms; ${fmt(b.proposals)} proposals, `
      + `${fmt(b.liveness)} liveness, ${fmt(b.deadLetters)} dead letters <small>(${esc(clock(b.ts))})</small>`]);
  }
  if (p.kafka_consumer_lag != null) rows.push(["job's lag on heartbeats (records)", fmt(p.kafka_consumer_lag)]);
  if (p.kafka) rows.push(["liveness records/s (from the job)", fmt(p.liveness_records_per_s)],
                         ["last liveness record", esc(clock(p.liveness_last_record_ms))]);
  if (p.events_topic_lag != null) rows.push(["events topic lag (entries)", fmt(p.events_topic_lag)]);
  rows.push(["ElectMaster outcomes here", Object.entries(p.elections).map(([k, v]) => `${esc(k)} ${fmt(v)}`).join(", ")]);
  rows.push(tier.available ? ["tier upload lag", `${fmt(tier.lag_entries)} entries, ${fmt(tier.lag_seconds)} s (uploaded index ${fmt(tier.uploaded_index)})`]
                           : ["tier upload lag", `<span class="na">unavailable: ${esc(tier.why)}</span>`]);
  for (const [k, why] of Object.entries(p.unavailable)) rows.push([k.replace(/_/g, " "), `<span class="na">unavailable: ${esc(why)}</span>`]);
  $("pipeline").tBodies[0].innerHTML = rows.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${v}</td></tr>`).join("");
}

function render(f) {
  $("node").textContent = `node ${f.node.id}: ${f.node.role}, term ${f.node.term}, leader ${f.node.leader_id || "unknown"}`;
  for (const k of ["sets", "live_master", "master_down", "no_master"]) $(k).textContent = f.fleet[k];
  $("liveness-note").hidden = !f.fleet.liveness_unknown_why;
  $("liveness-note").textContent = f.fleet.liveness_unknown_why
    ? `master liveness unknown for ${f.fleet.liveness_unknown} sets: ${f.fleet.liveness_unknown_why}` : "";
  $("unhealthy").tBodies[0].innerHTML = f.fleet.unhealthy.map((u) =>
    `<tr><td><a href="#set=${encodeURIComponent(u.set)}">${esc(u.set)}</a></td><td>${esc(u.state)}</td><td>${esc(u.master ?? "none")}</td><td>${esc(u.epoch)}</td></tr>`).join("")
    || `<tr><td colspan="4" class="na">${f.fleet.sets === 0 ? "no broker sets yet"
         : f.fleet.liveness_unknown ? "none known to be unhealthy: master liveness is unknown (above)"
         : "every broker set has a live master"}</td></tr>`;
  renderFailovers(f.failovers);
  renderGroup(f.group);
  renderPipeline(f.pipeline, f.tier);
  if (f.feed.frame_bytes) {  // the previous frame's numbers: the first frame has none
    $("feed").textContent = `read-only; one shared frame per second for ${f.feed.viewers} viewer(s) of this node: `
      + `${f.feed.frame_bytes} bytes per frame, built in ${f.feed.build_ms_avg} ms on average (wall time, with the peers' metadata requests)`;
  }
  addSample(f.sample);
  redraw();
  if (openSet && f.failovers.some((x) => x.set === openSet && !setFailoversShown.has(x.index))) loadSet();
}

// ---------------------------------------------------------------- a broker set's page (#set=NAME)
let openSet = null, setTimer = null;
const setFailoversShown = new Set();
async function loadSet() {
  const name = openSet;
  const r = await fetch(`/v1/dashboard/sets/${encodeURIComponent(name)}`);
  if (name !== openSet) return;
  if (!r.ok) { $("setbody").innerHTML = `<p class="na">${esc((await r.json()).remark)}</p>`; return; }
  const s = await r.json();
  s.failovers.forEach((f) => setFailoversShown.add(f.index));
  const st = s.state;
  const brokers = Object.entries(st.brokers).map(([id, addr]) => {
    const l = s.liveness[id];
    return `<tr><td>${esc(id)}${+id === st.masterBrokerId ? " <b>master</b>" : ""}</td><td>${esc(addr)}</td>
      <td>${st.syncStateSet.includes(+id) ? "in sync" : ""}</td>
      <td>${l ? (l.alive ? "alive" : "silent") + ", last heartbeat " + clock(l.last_heartbeat_ms) : "no heartbeat here"}</td></tr>`;
  }).join("");
  const h = s.history;
  const history = h.available
    ? `<table><thead><tr><th>index</th><th>time</th><th>event</th><th>master after</th><th>epoch</th></tr></thead><tbody>`
      + h.events.map((e) => `<tr><td>${esc(e.index)}</td><td>${esc(e.time)}</td><td>${esc(e.type)}</td>
          <td>${esc(e.state?.masterBrokerId ?? "–")}</td><td>${esc(e.state?.masterEpoch ?? "–")}</td></tr>`).join("")
      + `</tbody></table><small>${h.events.length} newest of ${h.total} events in the Delta tier</small>`
    : `<p class="na">history unavailable: ${esc(h.why)}</p>`;
  $("setbody").innerHTML = `<p>cluster ${esc(st.clusterName)}, master ${esc(st.masterBrokerId ?? "none")}, epoch ${esc(st.masterEpoch)},
    sync-state set [${esc(st.syncStateSet.join(", "))}] (epoch ${esc(st.syncStateSetEpoch)})</p>
    <table><thead><tr><th>broker</th><th>address</th><th>sync</th><th>liveness here</th></tr></thead><tbody>${brokers}</tbody></table>
    <h3>Failovers seen here</h3><p>${s.failovers.map((f) => `${clock(f.committed_ms)}: ${esc(f.old)} &rarr; ${esc(f.new)} (epoch ${esc(f.epoch)})`).join("<br>") || "none"}</p>
    <h3>History (Delta tier)</h3>${history}`;
}
function route() {
  const m = location.hash.match(/^#set=(.+)$/);
  clearInterval(setTimer);
  openSet = m ? decodeURIComponent(m[1]) : null;
  $("setpage").hidden = !openSet;
  if (!openSet) return;
  $("setname").textContent = openSet;
  $("setbody").textContent = "loading…";
  setFailoversShown.clear();
  loadSet();
  setTimer = setInterval(loadSet, 5000);
  $("setpage").scrollIntoView();
}
$("closeset").onclick = (e) => { e.preventDefault(); location.hash = ""; };

// ---------------------------------------------------------------- sign-in (docs/dashboard.md)
// A browser cannot send a bearer token on an EventSource: the token (from the URL fragment
// #token=..., which never reaches a server, or from the form) is exchanged once for an HttpOnly
// cookie that the node accepts on the dashboard's read-only data routes only.
async function login(token) {
  const r = await fetch("/v1/dashboard/login", {method: "POST", headers: {"Content-Type": "application/json"},
                                                body: JSON.stringify({token})});
  if (r.ok) return null;
  try { return (await r.json()).remark; } catch { return `sign-in failed (HTTP ${r.status})`; }
}
function showLogin(message) {
  if (source) { source.close(); source = null; }
  $("overview").hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("conn").textContent = "signed out"; $("conn").className = "badge off";
  $("login-error").textContent = message || "";
  $("token").focus();
}
async function start() {
  const m = location.hash.match(/^#token=(.+)$/);
  if (m) {
    history.replaceState(null, "", location.pathname + location.search);  // out of the address bar and history
    const err = await login(decodeURIComponent(m[1]));
    if (err) { showLogin(err); return; }
  }
  const r = await fetch("/v1/dashboard/session");
  if (!r.ok) { showLogin(r.status === 401 ? "" : `HTTP ${r.status}`); return; }
  const who = await r.json();
  $("who").textContent = `${who.name} (${who.role})`;
  $("logout").hidden = !who.cookie;
  $("login").hidden = true;
  $("overview").hidden = false;
  route();
  startFeed();
}
$("login-form").onsubmit = async (e) => {
  e.preventDefault();
  const token = $("token").value.trim();
  $("token").value = "";
  const err = await login(token);
  if (err) showLogin(err); else start();
};
$("logout").onclick = async (e) => {
  e.preventDefault();
  await fetch("/v1/dashboard/logout", {method: "POST"});
  showLogin("signed out");
};
window.addEventListener("hashchange", () => { if (location.hash.startsWith("#token=")) start(); else route(); });

// ---------------------------------------------------------------- the live feed
let source = null;
// A node sends a frame every second. One that stops (hung, partitioned, its loop stalled) keeps the connection
// open and says nothing: what the page shows is then old, and says so.
const STALE_AFTER_MS = 5000, RECONNECT_AFTER_MS = 15000;
let lastFrameAt = Date.now();
function showLive() { $("conn").textContent = "live"; $("conn").className = "badge on"; }
setInterval(() => {
  if (!source || source.readyState === EventSource.CLOSED) return;  // signed out, or `start` asks again
  const quiet = Date.now() - lastFrameAt;
  if (quiet > STALE_AFTER_MS) {
    $("conn").textContent = `stale: no update for ${Math.round(quiet / 1000)} s`; $("conn").className = "badge off";
  }
  if (quiet > RECONNECT_AFTER_MS && source.readyState === EventSource.OPEN) startFeed();  // a fresh stream
}, 1000);

function startFeed() {
  if (source) source.close();
  source = new EventSource("/v1/dashboard/stream");
  source.addEventListener("history", (e) => { JSON.parse(e.data).forEach(addSample); redraw(); });
  source.addEventListener("frame", (e) => { lastFrameAt = Date.now(); showLive(); render(JSON.parse(e.data)); });
  source.onopen = () => {};  // "live" once a frame arrives: a hung node may accept a connection and send nothing
  source.onerror = () => {
    $("conn").textContent = "reconnecting"; $("conn").className = "badge off";
    // refused for good (signed out, token revoked, too many viewers): ask who we are again, without hammering
    if (source.readyState === EventSource.CLOSED) setTimeout(start, 2000);
  };
}
start();
