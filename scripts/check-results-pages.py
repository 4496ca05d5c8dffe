#!/usr/bin/env python3
"""Every figure on a results page comes from a stored record (issue 40 item 14).

For each docs/results/NAME.md, every number the page states (outside code,
link targets and commit ids) must be found in a file stored under
docs/results/NAME/ (the runs' report.md, results.json and other outputs of
the commands that wrote them), at the precision the page shows it: 38.3 is
found by 38.25 or 38.34, 4.9x by 4.94, 23 % by 0.23, 1.2 GiB by a byte count.
Small whole numbers (under 100: counts, sizes like 4 KiB, rounds) and dates,
times, issue, item, figure and table numbers are not checked: they name
things rather than measure them.

A figure worked out by hand, or quoted from a run whose record was not
kept, is reported with its line. Exit status 1 if any is found. History
quoted from runs whose records were not kept belongs under a heading that
says so ("... (records not kept)"): those sections are not checked, and the
reader is told they cannot be re-checked.

    scripts/check-results-pages.py [PAGE.md ...]   (default: every page)
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "results")
NUMBER = re.compile(r"(?<![\w.,#/~])\d+(?:,\d{3})*(?:\.\d+)?(?![\w/])")
RECORD_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
# Naming, not measuring: "issue 40", "item 13", "Fig. 5", "Figs. 8-10", "Table I", "§3.3", "round 2", "commit".
NAMING = re.compile(r"(issues?|items?|Fig\.|Figs\.|Figures?|Tables?|§|stop|rounds?|runs?|steps?|lanes?|attempts?|sessions?|points?|commits?|pages?|v|version|python|Python|PostgreSQL|Debian|ext|port|ports|line|lines|column|columns)\s*$")
# How a record's number may be shown on a page: as is, as a percentage, and in
# the larger units (k, M, G, Ki, Mi, Gi) or smaller ones (ms, µs).
SCALES = (1, 100, 1e-3, 1e-6, 1e-9, 2**-10, 2**-20, 2**-30, 1e3, 1e6)


UNKEPT = "records not kept"


def blank(m):
    return re.sub(r"[^\n]", " ", m.group(0))


def strip_unkept_sections(text):
    """Blank out the sections whose heading says their records were not kept."""
    lines = text.split("\n")
    skip_level = None
    for i, line in enumerate(lines):
        h = re.match(r"(#+)\s", line)
        if h:
            level = len(h.group(1))
            if skip_level is not None and level <= skip_level:
                skip_level = None
            if skip_level is None and UNKEPT in line:
                skip_level = level
        if skip_level is not None:
            lines[i] = ""
    return "\n".join(lines)


def strip_unchecked(text):
    """Blank out what names rather than states a figure, keeping line numbers."""
    text = strip_unkept_sections(text)
    text = re.sub(r"```.*?```", blank, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", blank, text)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    text = re.sub(r"\]\([^)\n]*\)", blank, text)  # link targets
    text = re.sub(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", blank, text)  # commit ids
    text = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", blank, text)  # dates
    text = re.sub(r"\b\d{1,2}:\d{2}(:\d{2})?\b", blank, text)  # times of day
    return text


def shown(value, decimals):
    """The ways `value` may appear with `decimals` decimals (either rounding of a half)."""
    out = set()
    step = 10 ** -decimals
    for v in (value, value + step * 0.4999, value - step * 0.4999):
        out.add(f"{v:.{decimals}f}")
    return out


def record_figures(dirs):
    figures = set()
    for d in dirs:
        for path in glob.glob(os.path.join(d, "**", "*"), recursive=True):
            if not os.path.isfile(path) or path.endswith((".svg", ".png")):
                continue
            with open(path, errors="ignore") as f:
                text = f.read()
            for m in RECORD_NUMBER.finditer(text.replace(",", "")):
                try:
                    figures.add(float(m.group(0)))
                except ValueError:
                    pass
    return figures


def index(figures):
    """Every rendering of every record figure, at 0-6 decimals, in every scale."""
    seen = set()
    for x in figures:
        for s in SCALES:
            v = abs(x * s)
            if v >= 1e15:
                continue
            for d in range(7):
                seen |= shown(v, d)
    return seen


def extra_dirs(text, page_dir):
    """Records a page names besides its own directory: `<!-- records: DIR DIR -->`."""
    out = []
    for m in re.finditer(r"<!--\s*records:([^>]*)-->", text):
        out += [os.path.normpath(os.path.join(page_dir, p)) for p in m.group(1).split()]
    return out


def check(page):
    name = os.path.splitext(os.path.basename(page))[0]
    with open(page) as f:
        raw = f.read()
    page_dir = os.path.dirname(page)
    dirs = [os.path.join(page_dir, name)] + extra_dirs(raw, page_dir)
    seen = index(record_figures(dirs))
    missing = []
    for lineno, line in enumerate(strip_unchecked(raw).split("\n"), 1):
        for m in NUMBER.finditer(line):
            text = m.group(0).replace(",", "")
            if "." not in text and float(text) < 100:
                continue
            if NAMING.search(line[: m.start()]):
                continue
            if text not in seen:
                missing.append((lineno, m.group(0)))
    return missing


def main(argv):
    pages = argv[1:] or sorted(glob.glob(os.path.join(ROOT, "*.md")))
    bad = 0
    for page in pages:
        missing = check(page)
        rel = os.path.relpath(page)
        if not missing:
            print(f"{rel}: every figure found in its records")
            continue
        bad += len(missing)
        lines = open(page).read().split("\n")
        print(f"{rel}: {len(missing)} figure(s) not found in its records:")
        for lineno in sorted({l for l, _ in missing}):
            figs = ", ".join(f for l, f in missing if l == lineno)
            print(f"  line {lineno}: {figs}: {lines[lineno - 1].strip()[:160]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
