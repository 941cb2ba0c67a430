"""The figures of ``make mutation`` per mutated module, as a Markdown table (docs/testing.md).

Run from the repository root after ``make mutation``: ``.venv/bin/python -m tests.mutation_report``.
It reads mutmut's results in ``mutants/`` and changes nothing. A module is "full" when every one of its
mutants has a verdict, "partial" otherwise (a run stopped by ``MUTATION_BUDGET``); the kill rate is over
the mutants checked (killed or timed out, over killed, timed out and survived), as ``make mutation``
prints it for the whole run. ``--survivors`` lists the surviving mutants' names after the table.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

#: mutmut's exit codes (mutmut.stats.status_by_exit_code): killed, or timed out (counted as killed).
KILLED = {1, 3, 36, 24, -24, 152, 255}
SURVIVED = {0}
NO_TEST = {5, 33}


def rows(root: Path = Path("mutants")) -> list[tuple[str, Counter[str], list[str]]]:
    found = []
    for meta in sorted((root / "safeupdates").rglob("*.py.meta")):
        module = str(meta.relative_to(root))[: -len(".py.meta")].replace("/", ".")
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        counts: Counter[str] = Counter(total=len(codes))
        survivors = []
        for name, code in codes.items():
            if code is None:
                counts["unchecked"] += 1
            elif code in KILLED:
                counts["killed"] += 1
            elif code in SURVIVED:
                counts["survived"] += 1
                survivors.append(name)
            elif code in NO_TEST:
                counts["no test"] += 1
            else:
                counts["other"] += 1  # suspicious, segfault, skipped: neither killed nor survived
        found.append((module, counts, sorted(survivors)))
    return found


def table(found: list[tuple[str, Counter[str], list[str]]]) -> str:
    lines = [
        "| module | mutants | checked | killed | survived | no test | kill rate | extent |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    totals: Counter[str] = Counter()
    for module, counts, _survivors in found:
        totals.update(counts)
        lines.append(_line(module, counts))
    lines.append(_line("all", totals))
    return "\n".join(lines)


def _line(module: str, counts: Counter[str]) -> str:
    checked = counts["killed"] + counts["survived"]
    rate = f"{counts['killed'] / checked:.0%}" if checked else "-"
    done = counts["total"] - counts["unchecked"]
    partly = f"partially ({done}/{counts['total']})" if done else "not run"
    extent = partly if counts["unchecked"] else "fully"
    return (
        f"| {module} | {counts['total']} | {checked} | {counts['killed']} | {counts['survived']} "
        f"| {counts['no test']} | {rate} | {extent} |"
    )


def main(argv: list[str]) -> None:
    found = rows()
    print(table(found))
    if "--survivors" in argv:
        for _module, _counts, survivors in found:
            for name in survivors:
                print(name)


if __name__ == "__main__":
    main(sys.argv[1:])
