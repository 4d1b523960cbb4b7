#!/usr/bin/env python3
"""Loss curves of several runs, from their `ptrain train --log-jsonl` files, as an SVG chart and a Markdown table.

    python3 scripts/loss_curves.py amp-bf16=runs/a.jsonl fp8=runs/b.jsonl --svg curves.svg --every 30

The table gives each run's train/loss at every --every-th logged step both runs have, and the last run's
relative difference from the first's (what "fp8 ends within 2% of amp-bf16" is read from). Python's standard
library only: the machines that train have no plotting package.
"""
import argparse
import json
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def read_curve(path, key):
    points = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"loss_curves: {path}:{number}: not a JSON line ({e.msg})")
            if key in row and "step" in row:
                points[int(row["step"])] = float(row[key])
    if not points:
        sys.exit(f"loss_curves: {path}: no line has both 'step' and '{key}'")
    return sorted(points.items())


def svg_chart(curves, key, width=720, height=400):
    left, right, top, bottom = 64, 16, 16, 48
    steps = [s for _, pts in curves for s, _ in pts]
    values = [v for _, pts in curves for _, v in pts]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad

    def x(s):
        return left + (s - x0) / (x1 - x0) * (width - left - right)

    def y(v):
        return top + (y1 - v) / (y1 - y0) * (height - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>']
    for i in range(6):
        v = y0 + (y1 - y0) * i / 5
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    for i in range(6):
        s = x0 + (x1 - x0) * i / 5
        out.append(f'<text x="{x(s):.1f}" y="{height - bottom + 16}" text-anchor="middle">{s:.0f}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.1f}" y="{height - 8}" text-anchor="middle">step</text>')
    out.append(f'<text x="14" y="{(top + height - bottom) / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {(top + height - bottom) / 2:.1f})">{key}</text>')
    for i, (name, pts) in enumerate(curves):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x(s):.1f},{y(v):.2f}" for s, v in pts)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        out.append(f'<text x="{width - right - 8}" y="{top + 16 + 16 * i}" text-anchor="end" fill="{colour}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def markdown_table(curves, every):
    common = sorted(set.intersection(*(set(s for s, _ in pts) for _, pts in curves)))
    if not common:
        sys.exit("loss_curves: the runs have no logged step in common")
    shown = [s for s in common if s % every == 0] or common
    if shown[-1] != common[-1]:
        shown.append(common[-1])
    values = [dict(pts) for _, pts in curves]
    names = [name for name, _ in curves]
    diff = len(curves) > 1
    head = "| step | " + " | ".join(names) + (f" | {names[-1]} vs {names[0]} |" if diff else " |")
    rule = "| ---: |" + " ---: |" * (len(names) + (1 if diff else 0))
    rows = [head, rule]
    for s in shown:
        cells = [f"{v[s]:.4f}" for v in values]
        if diff:
            cells.append(f"{(values[-1][s] / values[0][s] - 1) * 100:+.2f}%")
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="NAME=FILE", help="a run's name and its --log-jsonl file")
    p.add_argument("--key", default="train/loss", help="the scalar to draw (default: train/loss)")
    p.add_argument("--svg", help="write the chart here")
    p.add_argument("--every", type=int, default=50, help="steps between the table's rows (default: 50)")
    a = p.parse_args()
    if a.every < 1:
        p.error("--every must be at least 1")
    curves = []
    for spec in a.runs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            p.error(f"{spec}: expected NAME=FILE")
        curves.append((name, read_curve(path, a.key)))
    if a.svg:
        with open(a.svg, "w", encoding="utf-8") as f:
            f.write(svg_chart(curves, a.key))
    sys.stdout.write(markdown_table(curves, a.every))


if __name__ == "__main__":
    main()
