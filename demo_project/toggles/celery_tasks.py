"""The naive Celery task that ``race_demo`` compares safeupdates against with ``DELIVERY=celery``: one task
per toggle, carrying the value, writing it unconditionally (as :func:`demo_project.toggles.jobs.naive_update`
does as an RQ job), declared with Celery's defaults (acknowledged when a worker receives it)."""

from __future__ import annotations

from celery import shared_task

from demo_project.toggles.models import Profile

#: Its name on the wire: ``race_demo`` sends it by name (``send_task``).
NAIVE_TOGGLE = "demo_project.toggles.naive_toggle"


@shared_task(name=NAIVE_TOGGLE)  # type: ignore[untyped-decorator,misc,unused-ignore]
def naive_toggle(pk: int, field: str, value: bool) -> int:
    """``UPDATE profile SET <field> = <value> WHERE id = <pk>``, no questions asked; the rows written."""
    return Profile.objects.filter(pk=pk).update(**{field: value})
