"""The verdicts of ``make mutation`` carried from one machine to the next (tests/mutation_report.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests import mutation_report

GUARD = "safeupdates.guard"


def write_meta(
    root: Path, codes: dict[str, int | None], hashes: dict[str, str], checked: set[str] | None = None
) -> Path:
    """A meta file of mutmut's for safeupdates/guard.py under ``root``, as mutmut writes it: a run that
    checked ``checked`` (default: every mutant with a verdict), each with the time it took."""
    meta = root / "safeupdates" / "guard.py.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    ran = {name for name, code in codes.items() if code is not None} if checked is None else checked
    durations = {name: 1.5 for name in sorted(ran)}
    extra = {"type_check_error_by_key": {}, "durations_by_key": durations, "estimated_durations_by_key": {}}
    meta.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes, **extra}))
    return meta


def codes_in(root: Path) -> dict[str, int | None]:
    return json.loads((root / "safeupdates" / "guard.py.meta").read_text())["exit_code_by_key"]


def test_verdicts_saved_come_back_where_mutmut_reads_them(tmp_path: Path) -> None:
    run, saved, fresh = tmp_path / "run", tmp_path / "saved", tmp_path / "fresh"
    write_meta(run, {f"{GUARD}.x_fetch_one__mutmut_1": 1, f"{GUARD}.x_fetch_one__mutmut_2": 0}, {"x_fetch_one": "a1"})

    assert mutation_report.save(saved, run) == 2
    assert mutation_report.restore(saved, fresh) == 2

    restored = json.loads((fresh / "safeupdates" / "guard.py.meta").read_text())
    assert restored["exit_code_by_key"] == {f"{GUARD}.x_fetch_one__mutmut_1": 1, f"{GUARD}.x_fetch_one__mutmut_2": 0}
    assert restored["hash_by_function_name"] == {"x_fetch_one": "a1"}
    # Every key mutmut's SourceFileMutationData.load() pops, and no other.
    assert set(restored) == {
        "exit_code_by_key",
        "hash_by_function_name",
        "type_check_error_by_key",
        "durations_by_key",
        "estimated_durations_by_key",
    }
    assert mutation_report.rows(fresh)[0][1]["killed"] == 1


def test_a_mutant_not_checked_this_time_keeps_its_verdict_while_its_function_is_unchanged(tmp_path: Path) -> None:
    saved, run = tmp_path / "saved", tmp_path / "run"
    mutation_report.save(
        saved,
        write_meta(
            tmp_path / "first",
            {f"{GUARD}.x_fetch_one__mutmut_1": 1, f"{GUARD}.x_write_if_newer__mutmut_1": 1},
            {"x_fetch_one": "a1", "x_write_if_newer": "b1"},
        ).parent.parent,
    )
    # The next run: x_write_if_newer changed (another hash), neither mutant checked yet, a third one new.
    write_meta(
        run,
        {
            f"{GUARD}.x_fetch_one__mutmut_1": None,
            f"{GUARD}.x_write_if_newer__mutmut_1": None,
            f"{GUARD}.x_write_if_newer__mutmut_2": 0,
        },
        {"x_fetch_one": "a1", "x_write_if_newer": "b2"},
    )

    mutation_report.save(saved, run)

    assert codes_in(saved) == {
        f"{GUARD}.x_fetch_one__mutmut_1": 1,  # its function unchanged: the verdict stands
        f"{GUARD}.x_write_if_newer__mutmut_1": None,  # its function changed: to be checked again
        f"{GUARD}.x_write_if_newer__mutmut_2": 0,  # this run's verdict
    }


def test_this_runs_verdict_wins_and_a_mutant_gone_is_dropped(tmp_path: Path) -> None:
    saved, run = tmp_path / "saved", tmp_path / "run"
    write_meta(saved, {f"{GUARD}.x_fetch_one__mutmut_1": 0, f"{GUARD}.x_gone__mutmut_1": 1}, {"x_fetch_one": "a1"})
    write_meta(run, {f"{GUARD}.x_fetch_one__mutmut_1": 1}, {"x_fetch_one": "a1"})

    mutation_report.save(saved, run)

    assert codes_in(saved) == {f"{GUARD}.x_fetch_one__mutmut_1": 1}


def test_two_runs_from_the_same_verdicts_merge_in_either_order(tmp_path: Path) -> None:
    """Two runs at once, each started from the saved verdicts and each checking survivors by name: the
    verdicts a run only put back when it started never undo what the other run found."""
    one, two = f"{GUARD}.x_fetch_one__mutmut_1", f"{GUARD}.x_fetch_one__mutmut_2"
    hashes = {"x_fetch_one": "a1"}
    for order in ("AB", "BA"):
        saved = tmp_path / order / "saved"
        write_meta(saved, {one: 0, two: 0}, hashes)
        runs = {
            "A": write_meta(tmp_path / order / "A", {one: 1, two: 0}, hashes, checked={one}).parent.parent,
            "B": write_meta(tmp_path / order / "B", {one: 0, two: 1}, hashes, checked={two}).parent.parent,
        }
        for name in order:
            mutation_report.save(saved, runs[name])
        assert codes_in(saved) == {one: 1, two: 1}, order
        mutation_report.save(
            saved, write_meta(tmp_path / order / "C", {one: 0, two: 0}, hashes, checked={one}).parent.parent
        )
        assert codes_in(saved) == {one: 0, two: 1}  # checked again (the tests changed): this run's verdict
        # A SQLite run started before C was merged: the kill of `one` it put back is not its own.
        sqlite = write_meta(tmp_path / order / "sqlite", {one: 1, two: 1}, hashes, checked=set()).parent.parent
        mutation_report.save(saved, sqlite, kills_only=True)
        assert codes_in(saved) == {one: 0, two: 1}


def test_a_restore_never_overwrites_the_verdicts_of_a_run_on_this_machine(tmp_path: Path) -> None:
    saved, run = tmp_path / "saved", tmp_path / "run"
    write_meta(saved, {f"{GUARD}.x_fetch_one__mutmut_1": 0}, {"x_fetch_one": "a1"})
    write_meta(run, {f"{GUARD}.x_fetch_one__mutmut_1": 1}, {"x_fetch_one": "a1"})

    assert mutation_report.restore(saved, run) == 0
    assert codes_in(run) == {f"{GUARD}.x_fetch_one__mutmut_1": 1}


def test_a_sqlite_run_adds_its_kills_and_nothing_else(tmp_path: Path) -> None:
    """``--kills-only``: a mutant PostgreSQL let live that SQLite kills is killed; SQLite's "survived",
    "no test" or unchecked never replaces a saved verdict, nor does a kill of a function changed since."""
    saved, run = tmp_path / "saved", tmp_path / "run"
    write_meta(
        saved,
        {
            f"{GUARD}.x_fetch_one__mutmut_1": 0,
            f"{GUARD}.x_fetch_one__mutmut_2": 1,
            f"{GUARD}.x_fetch_one__mutmut_3": 0,
            f"{GUARD}.x_fetch_one__mutmut_4": None,
            f"{GUARD}.x_write_if_newer__mutmut_1": 0,
        },
        {"x_fetch_one": "a1", "x_write_if_newer": "b1"},
    )
    write_meta(
        run,
        {
            f"{GUARD}.x_fetch_one__mutmut_1": 1,  # killed on SQLite
            f"{GUARD}.x_fetch_one__mutmut_2": 33,  # its test is PostgreSQL-only
            f"{GUARD}.x_fetch_one__mutmut_3": 0,
            f"{GUARD}.x_fetch_one__mutmut_4": 0,
            f"{GUARD}.x_write_if_newer__mutmut_1": 1,  # killed, but in a function changed since it was saved
        },
        {"x_fetch_one": "a1", "x_write_if_newer": "b2"},
    )

    assert mutation_report.save(saved, run, kills_only=True) == 4

    assert codes_in(saved) == {
        f"{GUARD}.x_fetch_one__mutmut_1": 1,
        f"{GUARD}.x_fetch_one__mutmut_2": 1,
        f"{GUARD}.x_fetch_one__mutmut_3": 0,
        f"{GUARD}.x_fetch_one__mutmut_4": None,
        f"{GUARD}.x_write_if_newer__mutmut_1": 0,
    }
    assert json.loads((saved / "safeupdates" / "guard.py.meta").read_text())["hash_by_function_name"] == {
        "x_fetch_one": "a1",
        "x_write_if_newer": "b1",
    }


def test_the_mutants_not_checked_are_listed_by_name_to_split_between_runs(tmp_path: Path, capsys) -> None:
    write_meta(
        tmp_path,
        {f"{GUARD}.x_fetch_one__mutmut_2": None, f"{GUARD}.x_fetch_one__mutmut_1": 1, f"{GUARD}.x_a__mutmut_1": None},
        {"x_fetch_one": "a1", "x_a": "b1"},
    )
    assert mutation_report.unchecked(tmp_path) == [f"{GUARD}.x_a__mutmut_1", f"{GUARD}.x_fetch_one__mutmut_2"]
    mutation_report.main(["--unchecked", "--in", str(tmp_path)])
    assert capsys.readouterr().out.split() == [f"{GUARD}.x_a__mutmut_1", f"{GUARD}.x_fetch_one__mutmut_2"]


def test_a_mutant_mypy_rejects_is_killed_and_counted_apart(tmp_path: Path) -> None:
    """mutmut's 37: the mutated copy fails ``type_check_command`` (mypy), which ``make test`` runs, so the
    change could not pass CI. It counts as killed, and the table says how many were mypy's."""
    run, saved = tmp_path / "run", tmp_path / "saved"
    codes = {
        f"{GUARD}.x_fetch_one__mutmut_1": 37,
        f"{GUARD}.x_fetch_one__mutmut_2": 1,
        f"{GUARD}.x_fetch_one__mutmut_3": 0,
        f"{GUARD}.x_fetch_one__mutmut_4": None,
    }
    write_meta(run, codes, {"x_fetch_one": "a1"})
    ((_module, counts, _survivors),) = mutation_report.rows(run)
    assert (counts["killed"], counts["by mypy"], counts["survived"], counts["unchecked"]) == (2, 1, 1, 1)
    assert mutation_report.table(mutation_report.rows(run)).splitlines()[:3] == [
        "| module | mutants | checked | killed | of which by mypy | survived | no test | kill rate | extent |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        "| safeupdates.guard | 4 | 3 | 2 | 1 | 1 | 0 | 67% | partially (3/4) |",
    ]
    # A SQLite run's (kills only) takes mypy's verdict as well: it does not depend on the database.
    write_meta(saved, {name: None for name in codes}, {"x_fetch_one": "a1"})
    mutation_report.save(saved, run, kills_only=True)
    assert codes_in(saved) == {**codes, f"{GUARD}.x_fetch_one__mutmut_3": None}


def test_the_summary_line_counts_mypys_verdicts_as_kills(tmp_path: Path, capsys) -> None:
    """``make mutation``'s last line (mutmut's own export has no count of the mutants mypy rejected)."""
    write_meta(
        tmp_path,
        {
            f"{GUARD}.x_fetch_one__mutmut_1": 37,
            f"{GUARD}.x_fetch_one__mutmut_2": 1,
            f"{GUARD}.x_fetch_one__mutmut_3": 0,
            f"{GUARD}.x_fetch_one__mutmut_4": None,
            f"{GUARD}.x_fetch_one__mutmut_5": 33,
        },
        {"x_fetch_one": "a1"},
    )
    mutation_report.main(["--summary", "--in", str(tmp_path)])
    assert capsys.readouterr().out == (
        "mutation: 2/3 mutants killed, kill rate 66.7% (1 by mypy, 1 survived, 1 without a test; 4 of 5 checked)\n"
    )
