"""The naive Django task that ``race_demo`` compares safeupdates against with ``DELIVERY=tasks``: one task
per toggle, carrying the value, writing it unconditionally (as :func:`demo_project.toggles.jobs.naive_update`
does as an RQ job)."""

from __future__ import annotations

from demo_project.toggles.models import Profile

try:  # Django 6.0+
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]


@task(queue_name="race_demo")  # type: ignore[untyped-decorator,misc,unused-ignore]
def naive_toggle(pk: int, field: str, value: bool) -> int:
    """``UPDATE profile SET <field> = <value> WHERE id = <pk>``, no questions asked; the rows written."""
    return Profile.objects.filter(pk=pk).update(**{field: value})
