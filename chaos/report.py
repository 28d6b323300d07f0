"""The HTML report: one self-contained page (inline SVG, no scripts, no network).

Per episode, a Jepsen-style timeline: fault bars on top, then every operation as
a point at its invocation time with its latency on the y axis (green ok, orange
refused, red unknown), and a strip of write availability; below it the checkers'
verdicts. Unknown operations have no latency: they are drawn at the top edge.
"""

from __future__ import annotations

import html
from typing import Any

from .history import operations

W, H, PAD = 900, 180, 40
COLORS = {"ok": "#2e7d32", "fail": "#ef6c00", "unknown": "#c62828"}
FAULT_COLORS = {"kill": "#b71c1c", "pause": "#6a1b9a", "partition": "#1565c0", "delay": "#00838f",
                "loss": "#2e7d32", "clock": "#f9a825", "disk-full": "#4e342e", "torn-tail": "#ad1457",
                "slow-disk": "#795548", "power-loss": "#000000"}


def _timeline(r: Any) -> str:
    ops = operations(r.log)
    faults = list(r.log.of_type("fault-start"))
    t_end = max([o["ret"] or o["call"] for o in ops] + [r.heal_at + 1.0, 1.0])
    lat_max = max([o["ret"] - o["call"] for o in ops if o["ret"] is not None] + [0.05])

    def x(t: float) -> float:
        return PAD + (W - 2 * PAD) * t / t_end

    def y(lat: float) -> float:
        return 40 + (H - 70) * (1 - min(lat, lat_max) / lat_max)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">',
             f'<rect x="{PAD}" y="40" width="{W - 2 * PAD}" height="{H - 70}" fill="#fafafa" stroke="#ccc"/>']
    for k, f in enumerate(faults):
        x0, x1 = x(f["mono"]), x(r.heal_at)
        color = FAULT_COLORS.get(f["kind"], "#555")
        parts.append(f'<rect x="{x0:.1f}" y="{4 + 10 * (k % 3)}" width="{max(x1 - x0, 1):.1f}" height="8" '
                     f'fill="{color}" opacity="0.8"><title>{html.escape(f["fault"] + " " + f.get("detail", ""))}'
                     f'</title></rect>')
        parts.append(f'<rect x="{x0:.1f}" y="40" width="{max(x1 - x0, 1):.1f}" height="{H - 70}" '
                     f'fill="{color}" opacity="0.08"/>')
    for o in ops:
        lat = (o["ret"] - o["call"]) if o["ret"] is not None else lat_max
        parts.append(f'<circle cx="{x(o["call"]):.1f}" cy="{y(lat):.1f}" r="2" fill="{COLORS[o["status"]]}">'
                     f'<title>{html.escape(o["op"])} {o["set"]} {o["status"]} {lat * 1000:.0f} ms</title></circle>')
    # Write availability: a cell per 100 ms, green if a write invoked in it was acknowledged.
    step = 0.1
    cells = int(t_end / step) + 1
    okw = [False] * cells
    tried = [False] * cells
    for o in ops:
        if o["op"] in ("apply_broker_id", "register", "elect", "alter_sss"):
            c = min(cells - 1, int(o["call"] / step))
            tried[c] = True
            okw[c] = okw[c] or o["status"] == "ok"
    for c in range(cells):
        if tried[c]:
            parts.append(f'<rect x="{x(c * step):.1f}" y="{H - 24}" width="{x(step) - PAD + 0.5:.1f}" height="8" '
                         f'fill="{"#66bb6a" if okw[c] else "#e57373"}"/>')
    parts.append(f'<text x="{PAD}" y="{H - 4}" font-size="10">0 s</text>'
                 f'<text x="{W - PAD - 30}" y="{H - 4}" font-size="10">{t_end:.1f} s</text>'
                 f'<text x="2" y="48" font-size="10">{lat_max * 1000:.0f} ms</text>'
                 f'<text x="{x(r.heal_at) + 2:.1f}" y="38" font-size="10">healed</text></svg>')
    return "".join(parts)


TIMELINES = 40  # passing episodes drawn in full; the rest get one line each (a soak has 1,000)


def _kinds_table(results: list[Any]) -> str:
    per_kind: dict[str, list[float]] = {}
    for r in results:
        for k, s in r.findings.unavailable:
            per_kind.setdefault(k, []).append(s)
    rows = []
    for k, v in sorted(per_kind.items()):
        v.sort()
        p99 = v[min(len(v) - 1, round(0.99 * (len(v) - 1)))]
        rows.append(f"<tr><td>{html.escape(k)}</td><td>{len(v)}</td><td>{v[len(v) // 2]:.2f}</td>"
                    f"<td>{p99:.2f}</td><td>{v[-1]:.2f}</td></tr>")
    return ("<table><tr><th>fault kind</th><th>faults</th><th>unavailable p50 s</th><th>p99 s</th>"
            f"<th>max s</th></tr>{''.join(rows)}</table>")


def render(cfg: Any, results: list[Any], skipped: dict[str, str]) -> str:
    failed = [r for r in results if not r.findings.ok]
    drawn = {id(r) for r in failed} | {id(r) for r in [r for r in results if r.findings.ok][:TIMELINES]}
    rows = []
    for r in results:
        f = r.findings
        if id(r) not in drawn:
            rows.append(f"<p class='brief'>Episode {r.number}: "
                        f"{html.escape('; '.join(x.label() for x in r.faults))} · {r.ops} ops · all checks ok</p>")
            continue
        verdicts = "".join(
            f'<li class="{"ok" if v.ok else "bad"}">{html.escape(v.checker)}: {"ok" if v.ok else "VIOLATED"} '
            f'({html.escape(v.detail)})</li>' for v in f.verdicts)
        unav = ", ".join(f"{k} {s:.2f}s" for k, s in f.unavailable) or "none measured"
        faults = "; ".join(html.escape(x.label() + (" " + x.detail if x.detail else "")) for x in r.faults)
        rows.append(f'<section class="{"ok" if f.ok else "bad"}"><h2>Episode {r.number}: {faults}</h2>'
                    f'<p>{r.ops} operations · unavailable: {unav} · recovery after healing: '
                    f'{f"{f.recovery_s:.2f}s" if f.recovery_s is not None else "none"} · history '
                    f'<code>{html.escape(str(r.history))}</code></p>{_timeline(r)}<ul>{verdicts}</ul></section>')
    skipped_html = ("".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in skipped.items())
                    or "<li>none</li>")
    head = (f"<h1>electra chaos: {len(results)} episodes, seed {cfg.seed}, {cfg.nodes} nodes — "
            f"{'ALL CHECKS PASSED' if not failed else f'{len(failed)} EPISODES FAILED'}</h1>"
            f"<p>Fault kinds: {html.escape(', '.join(cfg.kinds))}{' (mixed)' if cfg.mixed else ''}. "
            f"Skipped here:</p><ul>{skipped_html}</ul>"
            "<p>Timeline: fault bars on top (hover for target), operations by invocation time and latency "
            "(green ok, orange refused, red unknown: drawn at the top), write availability per 100 ms at the "
            "bottom.</p>" + _kinds_table(results))
    style = ("body{font-family:sans-serif;margin:20px;max-width:960px}section{border-left:4px solid #2e7d32;"
             "padding-left:10px;margin:18px 0}section.bad{border-color:#c62828}li.bad{color:#c62828;"
             "font-weight:bold}li.ok{color:#333}code{font-size:11px}p.brief{margin:2px 0;font-size:12px}"
             "td,th{padding:2px 10px;text-align:right}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>electra chaos</title>"
            f"<style>{style}</style></head><body>{head}{''.join(rows)}</body></html>")
