#!/usr/bin/env python3
"""Plots heap_bench's table as a PNG.

Reads what bench/heap_bench prints (from a file, or from stdin when INPUT is '-' or missing) and
draws, for every row, devmr's slab_ref, CUDA's device malloc and the bump-pointer floor side by
side on a log scale: one panel per phase (alloc, free, churn), rows grouped by thread count, then
block size. A file with several tables (bench/RESULTS.md) is read too: --table picks one.

  bench/heap_bench | tee heap_bench.txt
  bench/plot.py heap_bench.txt -o heap_bench.png
  bench/plot.py heap_bench.txt --metric time      # ns per operation instead of G ops/s

Needs matplotlib (pip install matplotlib). Exit status: 0 the PNG was written; 1 the input holds
no heap_bench table (or not the one asked for); 2 a bad command line, or matplotlib is missing.
"""

import argparse
import re
import sys

ALLOCATORS = ("devmr", "CUDA malloc", "floor")
COLORS = ("#1f77b4", "#d62728", "#7f7f7f")
PHASES = ("alloc", "free", "churn")

# threads  size  phase  devmr  malloc  floor  devmr/floor  devmr/malloc  target  verdict ...
ROW = re.compile(
    r"^(?P<threads>2\^\d+)\s+(?P<size>\d+ B|mixed)\s+(?P<phase>alloc|free|churn)\s+"
    r"(?P<devmr>\S+)\s+(?P<malloc>\S+)\s+(?P<floor>\S+)\s+(?P<ratio>\S+)\s+\S+\s+>=\S+\s+"
    r"(?P<verdict>\S+)"
)
TABLE_HEADER = re.compile(r"^threads\s+size\s+phase\s+devmr Gop/s")


class Cell:
    """One allocator's throughput in one row: G ops/s, or why there is none."""

    def __init__(self, text):
        self.text = text
        self.partial = text.endswith("*")  # fewer runs than planned
        try:
            self.gops = float(text.rstrip("*"))
        except ValueError:
            self.gops = None  # 'skipped', 'timeout' or '-'
        if self.gops is not None and self.gops <= 0.0:
            self.gops = None

    def value(self, metric):
        if self.gops is None:
            return None
        return self.gops if metric == "throughput" else 1.0 / self.gops  # ns per operation


class Table:
    def __init__(self):
        self.title = []  # the header lines heap_bench prints above the table
        self.rows = []


def parse(lines):
    """Returns the tables in `lines`, each with its header lines and rows, in order."""
    tables = []
    header = []
    current = None
    for raw in lines:
        line = raw.rstrip("\n")
        if line.startswith("heap_bench (") or line.startswith("date: "):
            if line.startswith("heap_bench ("):
                header = []
            header.append(line)
            continue
        if line.startswith("device ") or line.startswith("flags:"):
            header.append(line)
            continue
        if TABLE_HEADER.match(line):
            current = Table()
            current.title = list(header)
            tables.append(current)
            continue
        m = ROW.match(line)
        if m and current is not None:
            current.rows.append(
                {
                    "threads": m["threads"],
                    "size": m["size"],
                    "phase": m["phase"],
                    "cells": [Cell(m["devmr"]), Cell(m["malloc"]), Cell(m["floor"])],
                    "ratio": m["ratio"],
                    "verdict": m["verdict"],
                }
            )
    return [t for t in tables if t.rows]


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        sys.stderr.write(
            "plot.py needs matplotlib, which this Python does not have.\n"
            "Install it with:  pip install matplotlib\n"
            "(or, on Debian:   apt-get install python3-matplotlib)\n"
        )
        sys.exit(2)
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    return plt, Patch


def threads_key(label):
    return int(label.split("^")[1])


def size_key(label):
    return 1 << 40 if label == "mixed" else int(label.split()[0])


def layout(table, phase):
    """The rows of one phase, by thread count then size, and their x positions: one slot per
    row, a gap between thread counts."""
    rows = sorted(
        (r for r in table.rows if r["phase"] == phase),
        key=lambda r: (threads_key(r["threads"]), size_key(r["size"])),
    )
    xs = []
    x = 0.0
    previous = None
    for r in rows:
        if previous is not None and r["threads"] != previous:
            x += 0.6
        xs.append(x)
        x += 1.0
        previous = r["threads"]
    return rows, xs


def plot(table, output, metric, dpi):
    plt, Patch = require_matplotlib()
    phases = [p for p in PHASES if any(r["phase"] == p for r in table.rows)]
    widest = max(sum(1 for r in table.rows if r["phase"] == p) for p in phases)
    fig, axes = plt.subplots(
        len(phases), 1, figsize=(max(8.0, 0.75 * widest + 2.0), 3.6 * len(phases) + 0.8),
        squeeze=False)
    legend = [Patch(color=c, label=name) for c, name in zip(COLORS, ALLOCATORS)]
    unit = "G operations/s (log)" if metric == "throughput" else "ns per operation (log)"
    bar = 0.26
    layouts = [layout(table, phase) for phase in phases]
    span = max(xs[-1] - xs[0] for _, xs in layouts) + 1.2  # the same x scale in every panel
    for ax, phase, (rows, xs) in zip(axes[:, 0], phases, layouts):
        values = [v for r in rows for c in r["cells"] for v in [c.value(metric)] if v]
        floor_y = min(values) / 3.0 if values else 1e-3
        for k in range(len(ALLOCATORS)):
            for xi, r in zip(xs, rows):
                cell = r["cells"][k]
                pos = xi + (k - 1) * bar
                v = cell.value(metric)
                if v is None:
                    ax.text(pos, floor_y * 1.15, cell.text, rotation=90, ha="center",
                            va="bottom", fontsize=7, color=COLORS[k])
                    continue
                ax.bar(pos, v, bar, color=COLORS[k], hatch="//" if cell.partial else None,
                       edgecolor="white" if cell.partial else COLORS[k], linewidth=0.0)
        # devmr/floor above each row, as heap_bench prints it; ERROR where a check failed.
        for xi, r in zip(xs, rows):
            tops = [c.value(metric) for c in r["cells"] if c.value(metric)]
            top_y = max(tops) * 1.25 if tops else floor_y * 10.0
            if r["verdict"] == "ERROR":
                ax.text(xi, top_y, "ERROR", ha="center", va="bottom", fontsize=7,
                        color="#d62728", fontweight="bold")
            elif tops and r["ratio"] != "-":
                ax.text(xi, top_y, r["ratio"] + "x", ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        top = max(values) if values else 1.0
        ax.set_ylim(floor_y, top * 4.0)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{r['threads']}\n{r['size']}" for r in rows], fontsize=8)
        ax.set_xlim(xs[0] - 0.6, xs[0] - 0.6 + span)
        ax.set_ylabel(unit)
        ax.set_title(f"{phase}   (number above a row: devmr/floor throughput)", fontsize=10,
                     loc="left")
        ax.grid(axis="y", which="major", linestyle=":", linewidth=0.6)
    title = "\n".join(line for line in table.title[1:4] if line) or "heap_bench"
    fig.suptitle("heap_bench\n" + title, fontsize=8, x=0.01, ha="left")
    fig.legend(handles=legend, fontsize=9, loc="upper right", ncol=3)
    note = ("hatched: fewer runs than planned ('*'); text instead of a bar: no time (skipped, "
            "timeout); ERROR: a check of the row failed (heap_bench's notes say which)")
    fig.text(0.01, 0.005, note, fontsize=7, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.02, 1, 0.94))
    fig.savefig(output, dpi=dpi)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(
        description="Plot bench/heap_bench's table (devmr, CUDA malloc, floor) as a PNG."
    )
    ap.add_argument("input", nargs="?", default="-",
                    help="heap_bench's output, or a file that holds it ('-' or none: stdin)")
    ap.add_argument("-o", "--output", default="heap_bench.png", help="PNG to write")
    ap.add_argument("--table", type=int, default=1,
                    help="which table of the input, counting from 1 (default 1)")
    ap.add_argument("--metric", choices=("throughput", "time"), default="throughput",
                    help="G operations/s (default), or ns per operation")
    ap.add_argument("--dpi", type=int, default=120)
    args = ap.parse_args(argv)

    if args.input == "-":
        lines = sys.stdin.readlines()
    else:
        try:
            with open(args.input, encoding="utf-8") as f:
                lines = f.readlines()
        except OSError as e:
            sys.stderr.write(f"plot.py: {e}\n")
            return 1
    tables = parse(lines)
    if not tables:
        sys.stderr.write("plot.py: no heap_bench table in the input\n")
        return 1
    if not 1 <= args.table <= len(tables):
        sys.stderr.write(f"plot.py: --table {args.table}, but the input has {len(tables)}\n")
        return 1
    table = tables[args.table - 1]
    plot(table, args.output, args.metric, args.dpi)
    print(f"plot.py: {len(table.rows)} rows (table {args.table} of {len(tables)}) -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
