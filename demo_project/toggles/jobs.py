"""The naive job path that ``race_demo`` compares safeupdates against.

This is the code the seeds start from: one job per toggle, carrying the value, writing it unconditionally.
It is correct as long as jobs run once each, one at a time, in the order they were enqueued, which no
queue promises.
"""

from __future__ import annotations

from demo_project.toggles.models import Profile


def naive_update(pk: int, field: str, value: bool) -> int:
    """RQ job: ``UPDATE profile SET <field> = <value> WHERE id = <pk>``, no questions asked.

    Returns the number of rows written (1, or 0 if the profile is gone).
    """
    return Profile.objects.filter(pk=pk).update(**{field: value})
