"""Two trees' benchmark reports side by side (scripts/compare_trees.sh).

    python3 scripts/compare_reports.py LOG

LOG holds runs of one benchmark command in two trees, taking turns, each
run's report between a line `=== base` or `=== this` and a line `=== end`.
Every row of the reports' time tables (`| T x B x F x S | implementation |
median us/step | ...`) is printed once, with each tree's medians in the
order they ran and this tree's median of them over the base's: above 1 is
slower. The no-work floor's row says how much the host moved between runs
where the host sets the pace."""

import re
import statistics
import sys
from collections import defaultdict

RUN = re.compile(r"^=== (base|this)\n(.*?)^=== end", re.M | re.S)
HEADING = "| T x B x F x S | implementation | median"
ROW = re.compile(r"^\| (\d+x\d+x\d+x\d+) \| ([^|]+?) \| ([\d.]+) \|")


def medians(text):
    """{(table, size, implementation): {tree: [median us/step, ...]}} of the
    runs in `text`, tables counted from 1 in each report's order."""
    found = defaultdict(lambda: defaultdict(list))
    for tree, report in RUN.findall(text):
        table = 0
        for line in report.splitlines():
            if line.startswith(HEADING):
                table += 1
            elif table and (row := ROW.match(line)):
                found[(table, row[1], row[2])][tree].append(float(row[3]))
    return found


def comparison(text):
    """The markdown table of the rows both trees ran."""
    lines = ["| table | T x B x F x S | implementation | base | this | this / base |",
             "|---:|:---|:---|:---|:---|---:|"]
    for (table, size, name), trees in medians(text).items():
        if "base" in trees and "this" in trees:
            ratio = statistics.median(trees["this"]) / statistics.median(trees["base"])
            lines.append(f"| {table} | {size} | {name} | "
                         f"{', '.join(map(str, trees['base']))} | "
                         f"{', '.join(map(str, trees['this']))} | {ratio:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as log:
        print(comparison(log.read()))
