"""Django tasks of the tests (tests/test_tasks_delivery.py): ``@idempotent`` on a task function, below
``@task`` and above it. Their side effect is counted in the database (a profile's score)."""

from __future__ import annotations

from django.db.models import F

from safeupdates.contrib.idempotent.decorators import idempotent
from tests.testapp.models import Profile

try:  # Django 6.0+
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[import-not-found,no-redef,unused-ignore]


@task(backend="db")  # type: ignore[untyped-decorator,misc,unused-ignore]
@idempotent(key="task-refund:{order}")
def refund(order: str) -> str:
    """Refund ``order`` once: one point of its profile's score per run of the body."""
    Profile.objects.filter(name=order).update(score=F("score") + 1)
    return f"refunded {order}"


@idempotent(key="task-credit:{order}")
@task(backend="db")  # type: ignore[untyped-decorator,misc,unused-ignore]
def credit(order: str) -> str:
    """As :func:`refund`, with ``@idempotent`` above ``@task``."""
    Profile.objects.filter(name=order).update(score=F("score") + 1)
    return f"credited {order}"


def debit(order: str) -> str:
    """As :func:`credit`, undecorated: a test decorates it at run time (``@task``, then ``@idempotent``)."""
    Profile.objects.filter(name=order).update(score=F("score") + 1)
    return f"debited {order}"
