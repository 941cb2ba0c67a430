"""The first stage of the job path: :func:`enqueue_update` records a request and enqueues its job.

The database is the source of truth and the queue only delivers: a request is a ``pending`` row of the
request log, written in the caller's transaction (the outbox); its job, handed to the delivery seam
(:mod:`safeupdates.delivery`) when that transaction commits, carries ids only. A backend that can tell a
record's job is waiting (RQ's ``unique=True``) gives a burst of toggles one job. The next stages:
:mod:`safeupdates.pipeline.apply` (the job) and :mod:`safeupdates.pipeline.relay` (redelivery of what
was lost).
"""

from __future__ import annotations

import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.contenttypes.models import ContentType
from django.db import models, router

from safeupdates import delivery, tracing
from safeupdates.database.registry import content_type_of
from safeupdates.database.transactions import after_commit
from safeupdates.exceptions import InvalidUpdate
from safeupdates.lifecycle import RequestLogQuerySet
from safeupdates.models import ProcessedRequest
from safeupdates.write.validation import (
    check_text,
    clean_changes,
    clean_pk,
    clean_request_id,
    object_id_of,
    recorded_changes,
    shown,
)


def enqueue_update(
    obj_or_model: models.Model | type[models.Model],
    pk: Any = None,
    *,
    request_id: uuid.UUID | str | None = None,
    queue: str | None = None,
    using: str | None = None,
    **changes: Any,
) -> ProcessedRequest:
    """Record a request to write ``changes`` to a row, and enqueue its job when the caller commits.

    Field names must be in the model's ``safe_update_fields`` and values must be valid for the model
    fields, else :class:`~safeupdates.exceptions.InvalidUpdate` is raised and nothing is written or
    enqueued. The request gets a version from the database, is written as ``pending`` in the caller's
    transaction (a rolled-back caller enqueues nothing), and its job is enqueued on commit. Passing the
    ``request_id`` of a request already recorded returns that request and records nothing new: while it
    is pending (a retry after an ambiguous commit, whose first delivery may never have run), its job is
    delivered again when the caller commits (a duplicate job finds nothing left to apply); once it has
    reached its outcome, it is a duplicate: signalled, see :mod:`safeupdates.signals`.

    The request is written to database ``using``: by default the router's database for writes of the
    model (given an instance, with it as the hint, as ``save()`` does: an instance stays on its database).
    Its job carries that database, so the worker applies it there.

    Given an instance, the request is for its row: a ``pk`` naming another row is refused
    (:class:`~safeupdates.exceptions.InvalidUpdate`), as is an unsaved instance without one.
    """
    hints: dict[str, Any] = {}
    instance = None
    if isinstance(obj_or_model, models.Model):
        model: type[models.Model] = type(obj_or_model)
        instance = obj_or_model
        pk = instance.pk if pk is None else pk
        hints["instance"] = instance
    elif isinstance(obj_or_model, type) and issubclass(obj_or_model, models.Model):
        model = obj_or_model
    else:
        raise InvalidUpdate(f"enqueue_update() takes a model instance or a model class, not {obj_or_model!r}.")
    # The fields come from the class given: a proxy may narrow its concrete model's safe_update_fields.
    allowed = getattr(model, "safe_update_fields", None)
    if allowed is None:
        raise InvalidUpdate(
            f"{model._meta.label} is not a SafeUpdateModel: give it safe_update_fields to enqueue updates."
        )
    using = using or router.db_for_write(model._meta.concrete_model or model, **hints)
    cleaned = clean_changes(model, changes, allowed=allowed, using=using)
    model = model._meta.concrete_model or model
    pk = clean_pk(model, pk)
    if instance is not None and pk != instance.pk:
        _refuse_another_row(model, instance, pk)
    object_id = object_id_of(model, pk)
    rid = uuid.uuid4() if request_id is None else clean_request_id(request_id)
    if queue is not None:
        _check_queue(queue)
    queue_name = delivery.queue_name(queue)
    content_type = content_type_of(model, using)
    record = ProcessedRequest(
        request_id=rid,
        content_type=content_type,
        object_id=object_id,
        changes=recorded_changes(model, cleaned),
        queue=queue_name,
    )
    log = RequestLogQuerySet(ProcessedRequest, using=using)
    with tracing.enqueue_span(model._meta.label, pk, str(rid)) as trace:
        created, others_pending = log.create_pending(record)
    if not created:
        existing = _known_request(log.get(request_id=rid), content_type, pk)
        if existing.is_terminal:
            log.report_duplicate(model, pk, existing)
        else:
            # A retry after an ambiguous commit: the first call's commit landed, its delivery may not have
            # run. Deliver again on commit (a duplicate job finds nothing pending) rather than wait for the
            # relay; on the queue the request was recorded with.
            _deliver_on_commit(existing, pk, model, likely_queued=True, trace=trace, using=using)
        return existing
    _deliver_on_commit(record, pk, model, likely_queued=others_pending, trace=trace, using=using)
    return record


def _deliver_on_commit(
    record: ProcessedRequest,
    pk: Any,
    model: type[models.Model],
    *,
    likely_queued: bool,
    trace: dict[str, str] | None,
    using: str,
) -> None:
    """Deliver pending request ``record`` (of row ``pk`` of ``model``) when the caller's transaction commits.
    If the broker is down at commit, the request stays pending and the relay delivers it."""
    what = f"{model._meta.label} pk={pk}"
    queue_name = record.queue or delivery.queue_name(None)
    request_id, content_type_id = record.request_id, record.content_type_id
    assert content_type_id is not None  # an update request of a row

    def deliver_on_commit() -> None:
        delivery.deliver_or_leave_for_relay(
            request_id,
            content_type_id,
            str(pk),
            queue_name,
            what=what,
            likely_queued=likely_queued,
            trace=trace,
            using=using,
        )

    after_commit(deliver_on_commit, using, robust=True)


def _check_queue(queue: Any) -> None:
    """Refuse a queue name the request log cannot record, whatever the backend serves (Celery's default
    and a Tasks backend without ``QUEUES`` take any name): it was a ``DataError`` (too long, a NUL) or a
    ``UnicodeEncodeError`` at the INSERT, which broke the caller's transaction."""
    what = f"queue {shown(queue)}"
    if not isinstance(queue, str):
        raise InvalidUpdate(f"{what} is not text; pass the name of a queue.")
    field = ProcessedRequest._meta.get_field("queue")
    limit = field.max_length or 0
    if len(queue) > limit:
        raise InvalidUpdate(f"{what} has {len(queue)} characters, and the request log's column holds at most {limit}.")
    check_text(field, queue, what)  # a NUL, a lone surrogate: as any text value of a write


def _refuse_another_row(model: type[models.Model], instance: models.Model, pk: Any) -> None:
    """Refuse ``enqueue_update(instance, pk)`` where ``pk`` names another row than the instance: the request
    would write ``pk``'s row, routed as the instance's, and which of the two the caller meant is a guess.
    The instance's own key in another form (``"5"`` for ``5``) is the same row, and accepted."""
    if instance.pk is not None and clean_pk(model, instance.pk) == pk:
        return
    given = "an unsaved instance" if instance.pk is None else f"the instance pk={instance.pk!r}"
    raise InvalidUpdate(
        f"{model._meta.label}: enqueue_update() was given {given} and pk={pk!r}, another row: pass the "
        "instance alone, or the model class and the key."
    )


async def aenqueue_update(obj_or_model: Any, pk: Any = None, **kwargs: Any) -> ProcessedRequest:
    """Async :func:`enqueue_update`, for async views."""
    return await sync_to_async(enqueue_update)(obj_or_model, pk, **kwargs)


def _known_request(existing: ProcessedRequest, content_type: ContentType, pk: Any) -> ProcessedRequest:
    """Return the request already recorded under a reused request id, if it targets the same row."""
    if existing.content_type_id != content_type.pk or existing.object_id != str(pk):
        raise InvalidUpdate(f"request_id {existing.request_id} was already used for another object.")
    return existing
