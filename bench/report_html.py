"""Self-contained report pages: inline SVG line charts and tables, no script and no network."""

from __future__ import annotations

import html
import math

COLORS = {"new": "#1f77b4", "legacy": "#d62728", "new p50": "#6baed6", "new p99": "#08519c",
          "legacy p50": "#fc9272", "legacy p99": "#a50f15"}
_W, _H, _L, _R, _T, _B = 640, 320, 70, 150, 20, 45


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-9)))
    while (hi - lo) / step > 8:
        step *= 2
    start = math.floor(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 2)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}" if v >= 0.01 else f"{v:.0e}"


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str, *,
               logx: bool = False, logy: bool = False, step: bool = False) -> str:
    """An SVG chart of `series` (name -> [(x, y)]); non-positive values are dropped on log axes."""
    pts = {k: [(x, y) for x, y in v if (x > 0 or not logx) and (y > 0 or not logy) and math.isfinite(y)]
           for k, v in series.items()}
    allp = [p for v in pts.values() for p in v]
    if not allp:
        return f"<figure><figcaption>{html.escape(title)}: no data</figcaption></figure>"
    xs, ys = [p[0] for p in allp], [p[1] for p in allp]
    x0, x1 = min(xs), max(xs)
    y0, y1 = (min(ys), max(ys)) if logy else (0.0, max(ys))
    if x0 == x1:
        x0, x1 = (x0 / 2, x1 * 2) if logx else (x0 - 1, x1 + 1)
    if y0 == y1:
        y0, y1 = (y0 / 2, y1 * 2) if logy else (0.0, y1 + 1)
    xt, yt = _ticks(x0, x1, logx), _ticks(y0, y1, logy)
    x0, x1 = min(x0, xt[0]) if logx else x0, max(x1, xt[-1]) if logx else x1
    y0, y1 = min(y0, yt[0]), max(y1, yt[-1])
    f = (lambda v: math.log10(v)) if logx else (lambda v: v)
    g = (lambda v: math.log10(v)) if logy else (lambda v: v)

    def sx(v: float) -> float:
        return _L + (f(v) - f(x0)) / ((f(x1) - f(x0)) or 1) * (_W - _L - _R)

    def sy(v: float) -> float:
        return _H - _B - (g(v) - g(y0)) / ((g(y1) - g(y0)) or 1) * (_H - _T - _B)

    out = [f'<figure><svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
           f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="11">',
           f'<rect x="{_L}" y="{_T}" width="{_W - _L - _R}" height="{_H - _T - _B}" fill="none" stroke="#999"/>']
    for t in xt:
        if x0 <= t <= x1:
            out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{_T}" y2="{_H - _B}" stroke="#eee"/>'
                       f'<text x="{sx(t):.1f}" y="{_H - _B + 14}" text-anchor="middle">{_fmt(t)}</text>')
    for t in yt:
        if y0 <= t <= y1:
            out.append(f'<line x1="{_L}" x2="{_W - _R}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
                       f'<text x="{_L - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<text x="{(_W - _R + _L) / 2}" y="{_H - 8}" text-anchor="middle">{html.escape(xlabel)}</text>'
               f'<text transform="translate(14 {(_H - _B) / 2}) rotate(-90)" text-anchor="middle">'
               f'{html.escape(ylabel)}</text>')
    for i, (name, v) in enumerate(pts.items()):
        color = COLORS.get(name, ["#2ca02c", "#9467bd", "#8c564b", "#e377c2"][i % 4])
        v = sorted(v)
        coords = []
        for j, (x, y) in enumerate(v):
            if step and j:
                coords.append(f"{sx(x):.1f},{sy(v[j - 1][1]):.1f}")
            coords.append(f"{sx(x):.1f},{sy(y):.1f}")
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(coords)}"/>')
        if len(v) <= 12:
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in v]
        ly = _T + 14 + 16 * i
        out.append(f'<line x1="{_W - _R + 10}" x2="{_W - _R + 30}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
                   f'stroke-width="2"/><text x="{_W - _R + 34}" y="{ly}">{html.escape(name)}</text>')
    out.append("</svg>")
    out.append(f"<figcaption>{html.escape(title)}</figcaption></figure>")
    return "".join(out)


def table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def page(title: str, sections: list[str]) -> str:
    style = ("body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:right}th{background:#f4f4f4}figure{margin:1.5em 0}figcaption{color:#555}"
             ".first-page{page-break-after:always}code{background:#f4f4f4}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(sections)}</body></html>\n")
