#!/usr/bin/env python3
"""The demo's loss picture: the comparison a user came for, in one look.

Top panel: the validation loss of each student (the CSV files `train --curves` and `distill --curves` write)
against the tokens trained on, on one axis, with the teacher's validation loss as a dashed line. Bottom panel:
the training losses on their own axis (for a distilled student its cross-entropy part, which compares with
the scratch student's loss; its distillation part on a separate line). Ticks are round numbers.

Usage: loss_picture.py OUT.svg TEACHER_VAL NAME=curves.csv [NAME=curves.csv ...]
Plain Python: no plotting library needed.
"""

import csv
import math
import os
import sys
from xml.sax.saxutils import escape

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]


def read(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.append({k: (float(v) if v != "" else None) for k, v in r.items()})
    if not rows:
        raise SystemExit(f"loss_picture: {path} holds no rows")
    return rows


def nice_ticks(lo, hi, n=5):
    """Round tick values (1, 2 or 5 times a power of ten) covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks, step


def label(v, step):
    digits = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return f"{v:.{digits}f}"


def tokens_label(v, step):
    if v == 0:
        return "0"
    if step >= 1e6 or v >= 1e6:
        return label(v / 1e6, step / 1e6) + "M"
    if step >= 1e3 or v >= 1e3:
        return label(v / 1e3, step / 1e3) + "k"
    return label(v, step)


class Panel:
    def __init__(self, out, top, height, title, xlim, ys):
        self.out, self.top, self.h = out, top, height
        self.L, self.R = 70, 720 - 190
        self.xt, self.xs = nice_ticks(*xlim)
        lo, hi = min(ys), max(ys)
        pad = (hi - lo) * 0.05 or 0.05
        self.yt, self.ys = nice_ticks(lo - pad, hi + pad)
        self.x0, self.x1 = self.xt[0], self.xt[-1]
        self.y0, self.y1 = self.yt[0], self.yt[-1]
        out.append(f'<text x="{self.L}" y="{top - 8}" font-size="14">{escape(title)}</text>')
        for y in self.yt:
            py = self.py(y)
            out.append(f'<line x1="{self.L}" y1="{py:.1f}" x2="{self.R}" y2="{py:.1f}" stroke="#e5e5e5"/>')
            out.append(f'<text x="{self.L - 6}" y="{py + 4:.1f}" text-anchor="end">{label(y, self.ys)}</text>')
        for x in self.xt:
            px = self.px(x)
            out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + height}" stroke="#f0f0f0"/>')
            out.append(f'<text x="{px:.1f}" y="{top + height + 16}" text-anchor="middle">'
                       f'{tokens_label(x, self.xs)}</text>')
        out.append(f'<rect x="{self.L}" y="{top}" width="{self.R - self.L}" height="{height}" fill="none" '
                   f'stroke="black"/>')
        self.legend = 0

    def px(self, x):
        return self.L + (x - self.x0) / (self.x1 - self.x0) * (self.R - self.L)

    def py(self, y):
        # Values above the range (the untrained start) are drawn at its edge.
        y = min(max(y, self.y0), self.y1)
        return self.top + self.h - (y - self.y0) / (self.y1 - self.y0) * self.h

    def line(self, xs, ys, color, name, dash=None, width=1.6, dots=False):
        pts = [(self.px(x), self.py(y)) for x, y in zip(xs, ys)]
        if not pts:
            return
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.out.append(f'<polyline fill="none" stroke="{color}" stroke-width="{width}"{d} points="' +
                        " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        if dots:
            for a, b in pts:
                self.out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{color}"/>')
        ly = self.top + 12 + 18 * self.legend
        self.legend += 1
        self.out.append(f'<line x1="{self.R + 12}" y1="{ly}" x2="{self.R + 34}" y2="{ly}" stroke="{color}" '
                        f'stroke-width="2.5"{d}/><text x="{self.R + 40}" y="{ly + 4}">{escape(name)}</text>')


def smooth(ys, k):
    """Moving average over k steps, so that the trend shows through the step-to-step noise."""
    out, acc = [], []
    for y in ys:
        acc.append(y)
        if len(acc) > k:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def main(argv):
    if len(argv) < 4:
        raise SystemExit(__doc__)
    out_path, teacher = argv[1], float(argv[2])
    runs = []
    for spec in argv[3:]:
        name, _, path = spec.partition("=")
        runs.append((name, read(path)))
    xmax = max(r["tokens"] for _, rows in runs for r in rows)
    # The axes fit what happens after the first tenth of the run: the untrained start (about ln V) would squeeze
    # the differences that matter into a sliver.
    late = 0.1 * xmax
    vals = [r["val"] for _, rows in runs for r in rows if r["val"] is not None and r["tokens"] >= late]
    vals = (vals or [r["val"] for _, rows in runs for r in rows if r["val"] is not None]) + [teacher]
    trains = [v for _, rows in runs for r in rows if r["tokens"] >= late for v in (r["hard"], r["soft"])
              if v is not None] or [0.0, 1.0]
    svg = []
    top = Panel(svg, 40, 250, "held-out loss (nats/token) against tokens trained on", (0, xmax), vals)
    for i, (name, rows) in enumerate(runs):
        pts = [(r["tokens"], r["val"]) for r in rows if r["val"] is not None]
        top.line([p[0] for p in pts], [p[1] for p in pts], COLORS[i % len(COLORS)], name, dots=True)
    top.line([0, xmax], [teacher, teacher], "#444", "teacher", dash="6,4")
    bottom = Panel(svg, 350, 190, "training loss (nats/token, moving average)", (0, xmax), trains)
    for i, (name, rows) in enumerate(runs):
        steps = [r for r in rows if r["loss"] is not None]
        k = max(1, len(steps) // 30)
        ce = [(r["tokens"], r["hard"]) for r in steps if r["hard"] is not None]
        if ce:
            bottom.line([p[0] for p in ce], smooth([p[1] for p in ce], k), COLORS[i % len(COLORS)],
                        f"{name}: cross-entropy")
        kd = [(r["tokens"], r["soft"]) for r in steps if r["soft"] is not None]
        if kd:
            bottom.line([p[0] for p in kd], smooth([p[1] for p in kd], k), COLORS[i % len(COLORS)],
                        f"{name}: distillation (T²·KL)", dash="2,3")
    W, H = 720, 580
    text = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
            f'font-size="12">\n<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(svg) +
            f'\n<text x="{(70 + 530) / 2}" y="{H - 6}" text-anchor="middle">tokens trained on</text>\n</svg>\n')
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    main(sys.argv)
