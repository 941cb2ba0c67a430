"""The figures of ``make mutation`` per mutated module, as a Markdown table (docs/testing.md).

Run from the repository root after ``make mutation``: ``.venv/bin/python -m tests.mutation_report``.
It reads mutmut's results in ``mutants/`` and, without ``--save`` or ``--restore``, changes nothing.
A module is "full" when every one of its mutants has a verdict, "partial" otherwise (a run stopped by
``MUTATION_BUDGET``); the kill rate is over the mutants checked (killed, timed out or rejected by mypy, over those
and the survivors), as ``make mutation`` prints it for the whole run. ``--survivors`` lists the
surviving mutants' names after the table; ``--unchecked`` prints only the names of the mutants not
checked yet, one per line; ``--summary`` prints the whole run's figures in one line; ``--in DIR`` reads
``DIR`` instead of ``mutants/``.

The verdicts outlive ``mutants/``, which stays on the machine that ran them: ``--save DIR`` merges them
into ``DIR`` (``tests/mutation_results``, in the repository), ``--restore DIR`` puts them back into
``mutants/`` before a run, and ``make mutation`` does both (after a run on SQLite, ``--save DIR
--kills-only``: see :func:`save`; ``--in RUN`` reads another run's ``mutants/``). mutmut keeps a
verdict only while the function it mutated hashes the same (its ``hash_by_function_name``), so a run
on another machine, days later, checks only the mutants of functions changed since and those never
checked: a full run can take several sessions. A verdict is not redone when only the tests change: a
new test may kill a mutant still listed as surviving (name it in ``MUTANTS=`` to check it again), and a
removed test may let a "killed" one live.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

#: mutmut's exit codes (mutmut.stats.status_by_exit_code): killed, or timed out (counted as killed).
KILLED = {1, 3, 36, 24, -24, 152, 255}
#: "caught by type check": the mutated copy fails setup.cfg's ``type_check_command`` (mypy, strict), which
#: ``make test`` runs, so the change could never pass CI. Killed, and counted apart ("of which by mypy").
BY_MYPY = {37}
REJECTED = KILLED | BY_MYPY
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
            elif code in BY_MYPY:
                counts["killed"] += 1
                counts["by mypy"] += 1
            elif code in SURVIVED:
                counts["survived"] += 1
                survivors.append(name)
            elif code in NO_TEST:
                counts["no test"] += 1
            else:
                counts["other"] += 1  # suspicious, segfault, skipped: neither killed nor survived
        found.append((module, counts, sorted(survivors)))
    return found


def unchecked(root: Path = Path("mutants")) -> list[str]:
    """The names of the mutants without a verdict, module by module: a list to split between runs
    (``make mutation MUTANTS="..."`` in two worktrees checks each part once; see docs/testing.md)."""
    names = []
    for meta in sorted((root / "safeupdates").rglob("*.py.meta")):
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        names += sorted(name for name, code in codes.items() if code is None)
    return names


def table(found: list[tuple[str, Counter[str], list[str]]]) -> str:
    lines = [
        "| module | mutants | checked | killed | of which by mypy | survived | no test | kill rate | extent |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    totals: Counter[str] = Counter()
    for module, counts, _survivors in found:
        totals.update(counts)
        lines.append(_line(module, counts))
    lines.append(_line("all", totals))
    return "\n".join(lines)


def summary(found: list[tuple[str, Counter[str], list[str]]]) -> str:
    """The run's figures in a line, the kill rate as in the table (killed over killed and survived)."""
    totals: Counter[str] = Counter()
    for _module, counts, _survivors in found:
        totals.update(counts)
    judged = totals["killed"] + totals["survived"]
    rate = totals["killed"] / judged if judged else 0.0
    return (
        f"mutation: {totals['killed']}/{judged} mutants killed, kill rate {rate:.1%} ({totals['by mypy']} by mypy, "
        f"{totals['survived']} survived, {totals['no test']} without a test; "
        f"{totals['total'] - totals['unchecked']} of {totals['total']} checked)"
    )


def _line(module: str, counts: Counter[str]) -> str:
    checked = counts["killed"] + counts["survived"]
    rate = f"{counts['killed'] / checked:.0%}" if checked else "-"
    done = counts["total"] - counts["unchecked"]
    partly = f"partially ({done}/{counts['total']})" if done else "not run"
    extent = partly if counts["unchecked"] else "fully"
    return (
        f"| {module} | {counts['total']} | {checked} | {counts['killed']} | {counts['by mypy']} | {counts['survived']} "
        f"| {counts['no test']} | {rate} | {extent} |"
    )


def _function(mutant: str) -> str:
    """The key of ``hash_by_function_name`` of ``mutant`` (``pkg.module.x_name__mutmut_3`` -> ``x_name``)."""
    return mutant.rsplit("__mutmut_", 1)[0].rpartition(".")[2]


def _verdicts(meta: Path) -> tuple[dict[str, int | None], dict[str, str]]:
    if not meta.exists():
        return {}, {}
    data = json.loads(meta.read_text())
    return data["exit_code_by_key"], data["hash_by_function_name"]


def _checked(meta: Path) -> set[str]:
    """The mutants that the run (or runs) writing ``meta`` checked: mutmut records how long each mutant it
    ran took, and mypy's error for each one mypy rejected. A verdict :func:`restore` put back has neither."""
    if not meta.exists():
        return set()
    data = json.loads(meta.read_text())
    return set(data.get("durations_by_key", {})) | set(data.get("type_check_error_by_key", {}))


def save(into: Path, root: Path = Path("mutants"), *, kills_only: bool = False) -> int:
    """Merge the verdicts of ``root`` into ``into``: a mutant keeps the verdict of this run, else the one
    saved before if its function still hashes the same. Returns the number of verdicts saved.

    A verdict is this run's only if the run checked the mutant (:func:`_checked`), not if it was put back
    from ``into`` when the run started: two runs that started from the same verdicts, each checking
    mutants by name (survivors against new tests), merge in either order without the later one putting
    back the verdicts the earlier one changed.

    ``kills_only``: take only this run's kills, of mutants whose function hashes as when saved; every
    other verdict stays as saved. For a run on SQLite of the mutants that survived on PostgreSQL: the
    suite is both passes, so a mutant either pass kills is killed, and SQLite's "survived" or "no test"
    (a PostgreSQL-only test) must not replace PostgreSQL's verdict."""
    saved = 0
    for meta in sorted((root / "safeupdates").rglob("*.py.meta")):
        target = into / meta.relative_to(root)
        codes, hashes = _verdicts(meta)
        old_codes, old_hashes = _verdicts(target)
        checked = _checked(meta)
        unchanged = {name for name in codes if old_hashes.get(_function(name)) == hashes.get(_function(name))}
        if kills_only:
            merged = {
                name: codes[name] if name in checked and codes.get(name) in REJECTED and name in unchanged else old_code
                for name, old_code in sorted(old_codes.items())
            }
            hashes = old_hashes
        else:
            merged = {
                name: code
                if name in checked or name not in unchanged or old_codes.get(name) is None
                else old_codes[name]
                for name, code in sorted(codes.items())
            }
        target.parent.mkdir(parents=True, exist_ok=True)
        content = {"exit_code_by_key": merged, "hash_by_function_name": dict(sorted(hashes.items()))}
        target.write_text(json.dumps(content, indent=0, ensure_ascii=False) + "\n")
        saved += sum(code is not None for code in merged.values())
    return saved


def restore(source: Path, root: Path = Path("mutants")) -> int:
    """Put the verdicts saved in ``source`` where mutmut reads them, unless ``root`` holds its own."""
    restored = 0
    for saved in sorted((source / "safeupdates").rglob("*.py.meta")):
        meta = root / saved.relative_to(source)
        if meta.exists():
            continue
        codes, hashes = _verdicts(saved)
        meta.parent.mkdir(parents=True, exist_ok=True)
        empty: dict[str, object] = {
            "type_check_error_by_key": {},
            "durations_by_key": {},
            "estimated_durations_by_key": {},
        }
        meta.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes, **empty}))
        restored += sum(code is not None for code in codes.values())
    return restored


def main(argv: list[str]) -> None:
    if "--restore" in argv:
        where = Path(argv[argv.index("--restore") + 1])
        print(f"mutation: {restore(where)} verdicts restored from {where}")
        return
    root = Path(argv[argv.index("--in") + 1]) if "--in" in argv else Path("mutants")
    if "--save" in argv:
        where = Path(argv[argv.index("--save") + 1])
        kills_only = "--kills-only" in argv
        count = save(where, root, kills_only=kills_only)
        print(f"mutation: {count} verdicts saved in {where}{' (kills only)' if kills_only else ''}")
        return
    if "--summary" in argv:
        print(summary(rows(root)))
        return
    if "--unchecked" in argv:
        print("\n".join(unchecked(root)))
        return
    found = rows(root)
    print(table(found))
    if "--survivors" in argv:
        for _module, _counts, survivors in found:
            for name in survivors:
                print(name)


if __name__ == "__main__":
    main(sys.argv[1:])
