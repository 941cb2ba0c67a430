"""Celery tasks of the tests (tests/test_celery_delivery.py): ``@idempotent`` below ``@shared_task``, its
side effect counted in the database (a profile's score). Workers of ``tests.celery_app`` import it."""

from __future__ import annotations

from celery import shared_task
from django.db.models import F

from safeupdates.contrib.idempotent.decorators import idempotent
from tests.testapp.models import Profile


@shared_task(name="tests.refund_once", acks_late=True, serializer="json")  # type: ignore[untyped-decorator,misc,unused-ignore]
@idempotent(key="celery-refund:{order}")
def refund_once(order: str) -> str:
    """Refund ``order`` once: one point of its profile's score per run of the body."""
    Profile.objects.filter(name=order).update(score=F("score") + 1)
    return f"refunded {order}"
