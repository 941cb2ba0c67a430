"""The plan of ``race_demo``'s stress round, and its results: plain Python, no database, no Redis."""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass

#: The toggles of a profile: ``Profile.safe_update_fields``.
FIELDS: tuple[str, ...] = ("active", "newsletter", "dark_mode")


@dataclass(frozen=True)
class Toggle:
    """One click: set ``field`` of profile number ``record`` to ``value`` (the opposite of its last click)."""

    index: int
    record: int
    field: str
    value: bool


@dataclass(frozen=True)
class Plan:
    """The toggles of the stress round and the order in which they are clicked and their jobs delivered.

    ``events`` holds ``("click", k)`` in click order and ``("deliver", k)`` after each click by a random
    delay (up to half the round), a fifth of them twice: the same schedule for both paths.
    """

    toggles: tuple[Toggle, ...]
    events: tuple[tuple[str, int], ...]
    records: int
    seed: int

    @property
    def deliveries(self) -> int:
        """Jobs the plan delivers, duplicates included."""
        return sum(kind == "deliver" for kind, _ in self.events)

    @property
    def duplicates(self) -> int:
        """Deliveries of a toggle beyond its first one."""
        return self.deliveries - len(self.toggles)

    @property
    def fields(self) -> int:
        """Fields compared at the end: every toggle of every profile."""
        return self.records * len(FIELDS)

    def expected(self) -> dict[tuple[int, str], bool]:
        """What the user asked for: per field, the value of its newest (last clicked) toggle, else off."""
        final = {(record, name): False for record in range(self.records) for name in FIELDS}
        for toggle in self.toggles:
            final[toggle.record, toggle.field] = toggle.value
        return final


def make_plan(toggles: int, records: int, seed: int, *, duplicate_rate: float = 0.2) -> Plan:
    """Draw ``toggles`` random single-field toggles on ``records`` profiles, and their deliveries."""
    rng = random.Random(seed)
    current: dict[tuple[int, str], bool] = {}
    items = []
    for index in range(toggles):
        record, name = rng.randrange(records), rng.choice(FIELDS)
        value = not current.get((record, name), False)
        current[record, name] = value
        items.append(Toggle(index, record, name, value))
    # Time is counted in clicks. A delivery lags its click by up to half the round: late enough to
    # overtake the next toggles of the same field, which is what a queue with no ordering promise does.
    spread = max(2.0, toggles / 2)
    timed: list[tuple[float, int, str, int]] = [(float(index), 0, "click", index) for index in range(toggles)]
    for index in range(toggles):
        timed.append((index + rng.uniform(0, spread), 1, "deliver", index))
        if rng.random() < duplicate_rate:
            timed.append((index + rng.uniform(0, 2 * spread), 1, "deliver", index))
    timed.sort()
    return Plan(tuple(items), tuple((kind, index) for _, _, kind, index in timed), records, seed)


@dataclass(frozen=True)
class RoundResult:
    """What one path of the stress round ended with."""

    wrong: int
    fields: int
    duplicates: int
    absorbed: int
    stale_dropped: int
    seconds: float
    jobs: int
    lost: int
    killed_busy: bool
    relayed: int | None = None


def summary_line(naive: RoundResult, safe: RoundResult) -> str:
    """The demo's last line: ``naive: X/N fields wrong; safeupdates: Y/N fields wrong``."""
    return f"naive: {naive.wrong}/{naive.fields} fields wrong; safeupdates: {safe.wrong}/{safe.fields} fields wrong"


def what_the_kill_did(naive: RoundResult, safe: RoundResult) -> str:
    """In words, what became of the jobs the SIGKILL cut off, on each path: a naive job cut off is never
    run again; a safeupdates job cut off leaves its requests pending in the request log, and other jobs
    or the relay apply them (the round ends only when no request is pending)."""
    if naive.lost:
        first = (
            f"The SIGKILL cut off {_jobs(naive.lost)} on the naive path: never run again, so a click whose "
            "write was not made yet is lost for good."
        )
    else:
        first = "The SIGKILL cut off no job on the naive path."
    if safe.lost:
        whose = "its" if safe.lost == 1 else "their"
        if safe.relayed:
            how = f"the relay delivered {safe.relayed} record(s) again, whose jobs applied them."
        else:
            how = (
                "other jobs applied them (a job applies every pending request of its profile): the relay "
                "found nothing left to deliver."
            )
        second = (
            f"On the safeupdates path it cut off {_jobs(safe.lost)}: {whose} requests stayed pending in the "
            f"request log, and {how} Nothing was lost."
        )
    elif safe.relayed:
        second = (
            f"On the safeupdates path it cut off no job; the relay delivered {safe.relayed} record(s) whose "
            "requests were still pending, and their jobs applied them."
        )
    else:
        second = "On the safeupdates path it cut off no job."
    return textwrap.fill(f"{first} {second}", width=96)


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"
