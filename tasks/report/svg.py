"""Inline SVG charts for the report: lines, horizontal bars, a waterfall and a heatmap. No JavaScript,
no fonts or files fetched: the page draws offline. Every chart is ``<svg class="plot" data-marks="N">``
with its N marks (points, bars, cells) classed ``mark``, so a test can check each one was drawn."""

from __future__ import annotations

import math
from html import escape

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
MARGIN = {"left": 64, "right": 16, "top": 28, "bottom": 40}


def fmt(v: float) -> str:
    """Short tick and tooltip numbers: 0.0123, 1.5, 12k, 3.4M."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:  # one value: a little room on each side of it
        pad = max(1.0, abs(lo) * 0.1)
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    return [round(first + i * step, 12) for i in range(int(math.ceil((hi - first) / step)) + 1)]


def _frame(width: int, height: int, marks: int, title: str, body: list[str]) -> str:
    return (f'<svg class="plot" data-marks="{marks}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
            f'<text x="{width / 2}" y="16" text-anchor="middle" class="title">{escape(title)}</text>'
            + "".join(body) + "</svg>")


def line_chart(series: list[dict], *, title: str, x_label: str, y_label: str, width: int = 640,
               height: int = 260) -> str:
    """``series``: ``{"name", "points": [(x, y)], "markers": bool, "dashed": bool}``; a legend names each."""
    points = [p for s in series for p in s["points"] if p[1] is not None and math.isfinite(p[1])]
    if not points:
        return ""
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    xt, yt = ticks(x0, x1), ticks(y0, y1)
    x0, x1, y0, y1 = min(xt[0], x0), max(xt[-1], x1), min(yt[0], y0), max(yt[-1], y1)
    left, right = MARGIN["left"], width - MARGIN["right"]
    top, bottom = MARGIN["top"], height - MARGIN["bottom"]

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * (right - left)

    def sy(y: float) -> float:
        return bottom - (y - y0) / ((y1 - y0) or 1) * (bottom - top)

    body = [f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" class="axis"/>']
    body += [f'<text x="{sx(t):.1f}" y="{bottom + 14}" text-anchor="middle" class="tick">{fmt(t)}</text>'
             for t in xt if x0 <= t <= x1]
    body += [f'<line x1="{left}" y1="{sy(t):.1f}" x2="{right}" y2="{sy(t):.1f}" class="grid"/>'
             f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" class="tick">{fmt(t)}</text>'
             for t in yt if y0 <= t <= y1]
    body.append(f'<text x="{(left + right) / 2}" y="{height - 6}" text-anchor="middle" class="label">'
                f'{escape(x_label)}</text>')
    body.append(f'<text transform="translate(14 {(top + bottom) / 2}) rotate(-90)" text-anchor="middle" '
                f'class="label">{escape(y_label)}</text>')
    marks = 0
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = [(sx(x), sy(y)) for x, y in s["points"] if y is not None and math.isfinite(y)]
        if not pts:
            continue
        if len(pts) > 1 and not s.get("markers_only"):
            dash = ' stroke-dasharray="5 3"' if s.get("dashed") else ""
            body.append(f'<polyline class="series mark" fill="none" stroke="{color}" stroke-width="1.6"{dash} '
                        f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}"/>')
            marks += 1
        if s.get("markers") or len(pts) == 1:
            for (px, py), (x, y) in zip(pts, [p for p in s["points"] if p[1] is not None and math.isfinite(p[1])]):
                body.append(f'<circle class="mark" cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{color}">'
                            f'<title>{escape(s["name"])}: {fmt(y)} at {fmt(x)}</title></circle>')
                marks += 1
        ly = top + 4 + 14 * i
        body.append(f'<rect x="{right - 170}" y="{ly}" width="10" height="10" fill="{color}"/>'
                    f'<text x="{right - 156}" y="{ly + 9}" class="legend">{escape(s["name"])}</text>')
    return _frame(width, height, marks, title, body)


def hbars(rows: list[tuple[str, float, str]], *, title: str, unit: str = "", width: int = 640) -> str:
    """Horizontal bars, one per ``(label, value, css class)``, longest = the largest value."""
    if not rows:
        return ""
    height = MARGIN["top"] + 20 * len(rows) + 12
    label_w, right = 260, width - 90
    top_value = max(v for _, v, _ in rows) or 1
    body = []
    for i, (label, value, cls) in enumerate(rows):
        y = MARGIN["top"] + 20 * i
        w = max(1.0, (right - label_w) * value / top_value)
        body.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" class="tick">{escape(label)}</text>'
                    f'<rect class="mark {cls}" x="{label_w}" y="{y + 2}" width="{w:.1f}" height="14">'
                    f'<title>{escape(label)}: {value:,.0f}{unit}</title></rect>'
                    f'<text x="{label_w + w + 4:.1f}" y="{y + 13}" class="tick">{value:,.0f}{unit}</text>')
    return _frame(width, height, len(rows), title, body)


def waterfall(parts: list[tuple[str, float]], *, title: str, width: int = 640, height: int = 240) -> str:
    """Each part a bar starting where the previous ended, then the total: where the wall time went."""
    total = sum(max(0.0, v) for _, v in parts)
    if total <= 0:
        return ""
    left, right = MARGIN["left"], width - MARGIN["right"]
    top, bottom = MARGIN["top"], height - MARGIN["bottom"]
    n = len(parts) + 1
    slot = (right - left) / n

    def sy(v: float) -> float:
        return bottom - v / total * (bottom - top)

    body = [f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>']
    body += [f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" class="tick">{fmt(t)}</text>'
             f'<line x1="{left}" y1="{sy(t):.1f}" x2="{right}" y2="{sy(t):.1f}" class="grid"/>'
             for t in ticks(0, total) if t <= total]
    start = 0.0
    for i, (label, value) in enumerate([*parts, ("wall", total)]):
        lo, hi = (0.0, total) if label == "wall" else (start, start + max(0.0, value))
        x = left + slot * i + slot * 0.15
        body.append(f'<rect class="mark part-{escape(label)}" x="{x:.1f}" y="{sy(hi):.1f}" width="{slot * 0.7:.1f}" '
                    f'height="{max(1.0, sy(lo) - sy(hi)):.1f}"><title>{escape(label)}: {value:.3g} s '
                    f'({100 * value / total:.1f}%)</title></rect>'
                    f'<text x="{x + slot * 0.35:.1f}" y="{bottom + 14}" text-anchor="middle" class="tick">'
                    f'{escape(label)}</text><text x="{x + slot * 0.35:.1f}" y="{sy(hi) - 4:.1f}" '
                    f'text-anchor="middle" class="tick">{100 * value / total:.1f}%</text>')
        start = hi if label != "wall" else start
    body.append(f'<text transform="translate(14 {(top + bottom) / 2}) rotate(-90)" text-anchor="middle" '
                f'class="label">seconds</text>')
    return _frame(width, height, n, title, body)


def heatmap(row_labels: list[str], col_labels: list[str], values: list[list[float]], *, title: str,
            center: float = 1.0, spread: float = 0.5, width: int = 640) -> str:
    """Cells coloured blue (below ``center``) to white to red (``center + spread`` and above)."""
    if not values or not values[0]:
        return ""
    left, top = 90, MARGIN["top"]
    cell_w = (width - left - MARGIN["right"]) / len(col_labels)
    cell_h = 22
    height = top + cell_h * len(row_labels) + 34
    body, marks = [], 0
    for r, (label, row) in enumerate(zip(row_labels, values)):
        y = top + r * cell_h
        body.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end" class="tick">{escape(label)}</text>')
        for c, value in enumerate(row):
            t = max(-1.0, min(1.0, (value - center) / spread))
            red, blue = (255, int(255 * (1 - t))) if t >= 0 else (int(255 * (1 + t)), 255)
            fill = f"rgb({red},{min(red, blue)},{blue})"
            body.append(f'<rect class="mark" x="{left + c * cell_w:.1f}" y="{y}" width="{max(1.0, cell_w - 1):.1f}" '
                        f'height="{cell_h - 2}" fill="{fill}"><title>{escape(label)}, step {col_labels[c]}: '
                        f'{value:.2f}× the median</title></rect>')
            marks += 1
    every = max(1, len(col_labels) // 10)
    body += [f'<text x="{left + (c + 0.5) * cell_w:.1f}" y="{top + cell_h * len(row_labels) + 14}" '
             f'text-anchor="middle" class="tick">{escape(str(s))}</text>'
             for c, s in enumerate(col_labels) if c % every == 0]
    body.append(f'<text x="{(left + width) / 2}" y="{height - 4}" text-anchor="middle" class="label">'
                f'step (end of each window)</text>')
    return _frame(width, height, marks, title, body)
