#!/usr/bin/env python3
"""Draws one outage scenario of benches/outage.sh as an SVG timeline.

    python3 benches/outage_timeline.py TIMELINE FAULT_START_MS FAULT_END_MS TITLE > out.svg

TIMELINE is peer-server's GET /timeline (OUT/TAG.timeline.txt): per 10 ms
slot, answers by who decided them (Redis, the fallback, nobody) and status,
then how many took the server under 1, 2, 5, 10, 20, 50, 100, 250 ms and
longer. The fault's start and end are unix milliseconds (the SIGSTOP or
SIGKILL, and the SIGCONT or the restarted server's first PONG).

With leases on (the header has lease_period_ms), each slot has one more
count: the checks the store decided in process from a lease, sampled from
its lease stats. Those answers are among the store's (a leased decision is a
plain Decision), so per window they are taken out of the store's answers
and drawn as their own series; a count sampled a window late (at most a slot
or so) moves on to the next window rather than exceeding the store's answers.

Per 100 ms window it draws the answers per second, stacked by who decided
them, and the server-side p99: the upper bound of the time bucket holding
the 99th percentile (so a step function: "< 1 ms" ... "> 250 ms"), on a log
scale. Standard library only.
"""

import sys
from html import escape

WINDOW_MS = 100
WIDTH, LEFT, RIGHT = 960, 70, 20
TOP, RATE_H, GAP, P99_H, BOTTOM = 40, 220, 50, 160, 60
COLORS = {"lease": "#4e9a4e", "redis": "#3b7dd8", "fallback": "#e8a33d", "none": "#d64545"}
LABELS = {
    "lease": "decided in process from a lease (held tokens)",
    "redis": "decided by Redis",
    "fallback": "decided by the in-process fallback",
    "none": "no decision (store error: the policy allowed or denied)",
}


def read(path):
    bounds, rows, leases = [], [], False
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                for field in line[1:].split():
                    key, _, value = field.partition("=")
                    if key == "time_bounds_ms":
                        bounds = [int(b) for b in value.split(",")]
                    if key == "lease_period_ms":
                        leases = True
                continue
            v = [int(x) for x in line.split()]
            if v:
                rows.append(v)
    return bounds, rows, leases


def windows(rows, t0, nbuckets, leases):
    out = {}
    for v in rows:
        w = (v[0] - t0) // WINDOW_MS
        acc = out.setdefault(
            w, {"lease": 0, "redis": 0, "fallback": 0, "none": 0, "time": [0] * nbuckets, "sampled": 0}
        )
        acc["redis"] += sum(v[1:4])
        acc["fallback"] += sum(v[4:7])
        acc["none"] += sum(v[7:10])
        for i, n in enumerate(v[10 : 10 + nbuckets]):
            acc["time"][i] += n
        if leases and len(v) > 10 + nbuckets:
            acc["sampled"] += v[10 + nbuckets]
    # The leased decisions out of the store's answers, window by window; what
    # a window's store answers cannot take moves on to the next window.
    carry = 0
    for w in sorted(out):
        acc = out[w]
        have = acc.pop("sampled") + carry
        acc["lease"] = min(have, acc["redis"])
        acc["redis"] -= acc["lease"]
        carry = have - acc["lease"]
    return out


def p99_index(times):
    total = sum(times)
    if total == 0:
        return None
    cum = 0
    for i, n in enumerate(times):
        cum += n
        if cum >= 0.99 * total:
            return i
    return len(times) - 1


def nice_max(x):
    step = 1
    while step * 10 <= x:
        step *= 10
    for m in (1, 2, 5, 10):
        if m * step >= x:
            return m * step
    return 10 * step


def main():
    path, t0, t1, title = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    bounds, rows, leases = read(path)
    nb = len(bounds) + 1
    ws = windows(rows, t0, nb, leases)
    lo, hi = min(ws), max(ws) + 1
    plot_w = WIDTH - LEFT - RIGHT
    series = ("lease", "redis", "fallback", "none") if leases else ("redis", "fallback", "none")
    # The legend, in rows that fit the width.
    legend, lx = [[]], LEFT
    for who in series:
        w = 24 + 6.5 * len(LABELS[who])
        if legend[-1] and lx + w > WIDTH - RIGHT:
            legend.append([])
            lx = LEFT
        legend[-1].append((lx, who))
        lx += w
    height = TOP + RATE_H + GAP + P99_H + BOTTOM + 40 + 18 * (len(legend) - 1)
    x = lambda w: LEFT + (w - lo) * plot_w / (hi - lo)
    bar_w = plot_w / (hi - lo)
    rate = lambda n: n * 1000 / WINDOW_MS
    top_rate = nice_max(max(rate(sum(a[who] for who in series)) for a in ws.values()))
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    # Answers per second, stacked by who decided them.
    y_rate = lambda r: TOP + RATE_H - r * RATE_H / top_rate
    for i in range(5):
        r = top_rate * i / 4
        svg.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y_rate(r):.1f}" y2="{y_rate(r):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{y_rate(r) + 4:.1f}" text-anchor="end">{r:,.0f}</text>')
    svg.append(f'<text x="14" y="{TOP + RATE_H / 2}" transform="rotate(-90 14 {TOP + RATE_H / 2})" '
               f'text-anchor="middle">answers/s (100 ms windows)</text>')
    for w, a in sorted(ws.items()):
        base = 0.0
        for who in series:
            r = rate(a[who])
            if r:
                svg.append(f'<rect x="{x(w):.1f}" y="{y_rate(base + r):.1f}" width="{bar_w:.2f}" '
                           f'height="{y_rate(base) - y_rate(base + r):.1f}" fill="{COLORS[who]}"/>')
            base += r
    # Server-side p99, one step per window, on the bucket bounds.
    p99_top = TOP + RATE_H + GAP
    labels = [f"< {b} ms" for b in bounds] + [f"> {bounds[-1]} ms"]
    y_p99 = lambda i: p99_top + P99_H - (i + 0.5) * P99_H / nb
    for i, label in enumerate(labels):
        svg.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y_p99(i):.1f}" y2="{y_p99(i):.1f}" stroke="#eee"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{y_p99(i) + 4:.1f}" text-anchor="end" font-size="10">{escape(label)}</text>')
    svg.append(f'<text x="14" y="{p99_top + P99_H / 2}" transform="rotate(-90 14 {p99_top + P99_H / 2})" '
               f'text-anchor="middle">server p99</text>')
    # One line per run of windows with answers: a window without any (the
    # requests still waiting) breaks it rather than being drawn across.
    runs, points = [], []
    for w in range(lo, hi):
        i = p99_index(ws[w]["time"]) if w in ws else None
        if i is None:
            if points:
                runs.append(points)
            points = []
            continue
        points.append(f"{x(w):.1f},{y_p99(i):.1f} {x(w) + bar_w:.1f},{y_p99(i):.1f}")
    if points:
        runs.append(points)
    for run in runs:
        svg.append(f'<polyline points="{" ".join(run)}" fill="none" stroke="#333" stroke-width="1.5"/>')
    # Time axis: seconds from the fault's start.
    axis_y = p99_top + P99_H
    for s in range(lo * WINDOW_MS // 1000, hi * WINDOW_MS // 1000 + 1):
        w = s * 1000 / WINDOW_MS
        if lo <= w <= hi:
            svg.append(f'<line x1="{x(w):.1f}" x2="{x(w):.1f}" y1="{axis_y}" y2="{axis_y + 5}" stroke="#333"/>')
            svg.append(f'<text x="{x(w):.1f}" y="{axis_y + 18}" text-anchor="middle">{s}</text>')
    svg.append(f'<text x="{LEFT + plot_w / 2}" y="{axis_y + 36}" text-anchor="middle">'
               f'seconds since the fault started</text>')
    # The fault's start and end, across both panels.
    for at, label in ((t0, "fault starts"), (t1, "fault ends")):
        fx = x((at - t0) / WINDOW_MS)
        svg.append(f'<line x1="{fx:.1f}" x2="{fx:.1f}" y1="{TOP - 6}" y2="{axis_y}" stroke="black" '
                   f'stroke-dasharray="5,4"/>')
        svg.append(f'<text x="{fx + 4:.1f}" y="{TOP + 6}">{label}</text>')
    # Legend.
    for row, entries in enumerate(legend):
        ly = height - 18 - 18 * (len(legend) - 1 - row)
        for lx, who in entries:
            svg.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{COLORS[who]}"/>')
            svg.append(f'<text x="{lx + 16}" y="{ly}">{escape(LABELS[who])}</text>')
    svg.append("</svg>")
    print("\n".join(svg))


if __name__ == "__main__":
    main()
