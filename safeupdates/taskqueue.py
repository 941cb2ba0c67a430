"""Everything that touches Django's Tasks framework: the apply task, its delivery, coalescing and retries.

Used with ``SAFEUPDATES_DELIVERY = "tasks"``, on the ``TASKS`` backend ``SAFEUPDATES_TASK_BACKEND``.
``django.tasks`` (Django 6.0+) is used where it exists, else the ``django-tasks`` backport
(``django_tasks``, on Django 5.2): this module is imported only with tasks delivery, and by workers.

The apply task (:func:`apply_update`) carries the request id, the record's identity and an attempt number,
all JSON, never the changes (with OpenTelemetry, also the trace context of the enqueue); it runs
:func:`safeupdates.apply.apply_update`, which applies every pending request of the record, so a duplicated
or retried task changes nothing (its requests are reported as duplicates). Coalescing: on the database
backend of ``django-tasks-db`` a request whose record already has a task waiting (``READY``, not yet claimed
by a worker) gets no task of its own, as on RQ; other backends cannot be asked, so every request gets a task
and the apply path's duplicate safety does the rest. Retries: no backend of the framework retries a failed
task; a transient database error is retried here with a deferred task (``run_after``, the back-off of
``SAFEUPDATES_RETRY``) where the backend supports deferred runs, else the request stays pending for the
relay until its ``attempts`` are spent (system check ``safeupdates.W020``).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, router
from django.utils import timezone
from django.utils.module_loading import import_string

from safeupdates import conf, queues, tracing
from safeupdates.attempts import Attempt, current_attempt, running

try:  # Django 6.0+
    from django.tasks import task, task_backends  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2, with the django-tasks backport
    from django_tasks import task, task_backends  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]

if TYPE_CHECKING:
    from safeupdates.relay import RelayReport

__all__ = [
    "APPLY_TASK",
    "apply_update",
    "backend",
    "coalesces",
    "deliver",
    "deliver_or_leave_for_relay",
    "queue_name",
    "redeliver",
    "will_retry",
]

logger = logging.getLogger("safeupdates")

#: The apply task, by the dotted path under which workers import it.
APPLY_TASK = "safeupdates.taskqueue.apply_update"

#: What a delivery did: enqueued a task, or found the record's task waiting.
ENQUEUED, WAITING = "enqueued", "waiting"


def _import_queue() -> str:
    """The queue the task is declared with: ``SAFEUPDATES_QUEUE`` if the backend serves it, else one it
    serves (each delivery names its queue; a wrong ``SAFEUPDATES_QUEUE`` is check E023, not an error at
    import)."""
    allowed = getattr(task_backends[conf.task_backend()], "queues", None) or set()
    name = conf.queue_name()
    return name if not allowed or name in allowed else sorted(allowed)[0]


@task(takes_context=True, backend=conf.task_backend(), queue_name=_import_queue())  # type: ignore[untyped-decorator,misc,unused-ignore]
def apply_update(
    context: Any,
    request_id: str,
    record: str = "",
    attempt: int = 0,
    using: str = DEFAULT_DB_ALIAS,
    trace: dict[str, str] | None = None,
) -> str:
    """Django task: apply pending request ``request_id`` and every other pending request of its record
    (``record`` is ``content_type_id:object_id``, for coalescing and the logs; ``attempt`` counts the
    retries of transient database errors; ``using`` is the database the request is in; ``trace``, the
    trace context of the ``enqueue_update()`` that queued it, if any). See
    :func:`safeupdates.apply.apply_update`."""
    # By dotted path, as RQ jobs name it: the job path imports this module, not the other way round.
    apply = import_string(queues.APPLY_UPDATE)
    result = context.task_result
    with (
        running(Attempt(request_id, record, attempt, str(result.id), str(result.task.queue_name), using)),
        tracing.continue_trace(trace),
    ):
        return str(apply(request_id, using=using))


def backend() -> Any:
    """The task backend of ``SAFEUPDATES_TASK_BACKEND``."""
    return task_backends[conf.task_backend()]


def queue_name(queue: str | None) -> str:
    """The task queue to deliver on: ``queue``, else ``SAFEUPDATES_QUEUE``; it must be one of the
    backend's ``QUEUES`` (a backend that lists none takes any)."""
    from safeupdates.exceptions import InvalidUpdate

    name = queue or conf.queue_name()
    allowed = getattr(backend(), "queues", None) or set()
    if allowed and name not in allowed:
        choices = ", ".join(sorted(allowed))
        raise InvalidUpdate(
            f"queue {name!r} is not in the QUEUES of TASKS[{conf.task_backend()!r}]; pass one of: {choices}."
        )
    return name


def record_key(content_type_id: int, object_id: str) -> str:
    return f"{content_type_id}:{object_id}"


def coalesces() -> bool:
    """True if the backend can say whether a record's task is waiting (django-tasks-db's database
    backend): a burst of one record then costs one task."""
    return _db_results() is not None


def _db_results() -> Any:
    """django-tasks-db's queryset of task rows on the database they are written to, if the backend is
    its database backend; else None."""
    try:
        from django_tasks_db.backend import DatabaseBackend
        from django_tasks_db.models import DBTaskResult
    except ImportError:
        return None
    if not isinstance(backend(), DatabaseBackend):
        return None
    # The primary: a replica could still show READY a task that a worker has claimed meanwhile.
    return DBTaskResult.objects.using(router.db_for_write(DBTaskResult))


def _waiting(key: str, using: str) -> bool:
    """Is an apply task of record ``key`` waiting, not yet claimed by a worker?

    A worker claims a task (marks it ``RUNNING``) and commits before it runs it, and the task reads the
    pending requests after that. This is asked after the request's commit: a task still ``READY`` then
    will read the request.
    """
    results = _db_results()
    if results is None:
        return False
    return bool(
        results.filter(
            status="READY",
            task_path=APPLY_TASK,
            backend_name=conf.task_backend(),
            args_kwargs__kwargs__record=key,
            args_kwargs__kwargs__using=using,
        ).exists()
    )


def deliver(
    request_id: uuid.UUID | str,
    content_type_id: int,
    object_id: str,
    queue: str,
    *,
    attempt: int = 0,
    delay: float | None = None,
    using: str = DEFAULT_DB_ALIAS,
    trace: dict[str, str] | None = None,
) -> tuple[Any, str]:
    """Make sure a task will apply ``request_id`` (a request in database ``using``): ``(task result,
    ENQUEUED)``, or ``(None, WAITING)`` if the record's task is waiting already (only known on the
    database backend). ``delay`` defers the task (a retry's back-off); ``trace`` is a trace context
    for the task to continue (only ids and it travel, never the changes)."""
    key = record_key(content_type_id, object_id)
    if delay is None and _waiting(key, using):
        return None, WAITING
    options: dict[str, Any] = {"backend": conf.task_backend(), "queue_name": queue}
    if delay is not None:
        options["run_after"] = timezone.now() + timedelta(seconds=delay)
    kwargs: dict[str, Any] = {"record": key, "attempt": attempt, "using": using}
    if trace:
        kwargs["trace"] = trace
    result = apply_update.using(**options).enqueue(str(request_id), **kwargs)
    return result, ENQUEUED


def deliver_or_leave_for_relay(
    request_id: uuid.UUID | str,
    content_type_id: int,
    object_id: str,
    queue: str,
    *,
    what: str,
    using: str = DEFAULT_DB_ALIAS,
    trace: dict[str, str] | None = None,
) -> Any:
    """:func:`deliver`, after the request's commit; if the backend fails (its database or its Redis is
    unreachable), log one warning and leave the request, saved and pending, to the relay."""
    try:
        return deliver(request_id, content_type_id, object_id, queue, using=using, trace=trace)[0]
    except Exception as exc:  # whatever the backend raises: the relay delivers it
        logger.warning(
            "safeupdates: request %s (%s) is saved, but task backend %r could not take its task (%s: %s): the "
            "relay will deliver it.",
            request_id,
            what,
            conf.task_backend(),
            type(exc).__name__,
            exc,
            extra={"request_id": str(request_id)},
        )
        return None


def redeliver(
    targets: dict[tuple[int, str], tuple[uuid.UUID, str]], report: RelayReport, using: str = DEFAULT_DB_ALIAS
) -> None:
    """The relay's deliveries with tasks delivery: one per record of ``targets``
    (``{(content_type_id, object_id): (request_id, queue)}``, requests in database ``using``), counted
    in ``report``."""
    from safeupdates.exceptions import BackendUnavailable

    allowed = getattr(backend(), "queues", None) or set()
    for (content_type_id, object_id), (request_id, wanted) in targets.items():
        queue = wanted
        if allowed and queue not in allowed:
            queue = conf.queue_name()
            report.warn(
                f"record {content_type_id}:{object_id} has work for task queue {wanted!r}, which is not in the "
                f"QUEUES of TASKS[{conf.task_backend()!r}]: delivered on {queue!r}."
            )
        try:
            _result, outcome = deliver(request_id, content_type_id, object_id, queue, using=using)
        except Exception as exc:
            raise BackendUnavailable(f"task backend {conf.task_backend()!r}", type(backend()).__name__, exc) from exc
        if outcome == WAITING:
            report.waiting += 1
        else:
            report.enqueued += 1


def retry_delay(number: int) -> float:
    """Seconds before retry ``number`` (0 for the first), from ``SAFEUPDATES_RETRY``'s ``interval``."""
    interval = conf.retry().get("interval", 0)
    if isinstance(interval, list | tuple):
        return float(interval[min(number, len(interval) - 1)]) if interval else 0.0
    return float(interval)


def will_retry(request_id: uuid.UUID) -> bool:
    """Called when the running apply task fails on a transient database error: True if the request
    stays ``pending`` because it will be tried again.

    ``SAFEUPDATES_RETRY["max"]`` retries in all. On a backend with deferred runs the next try is a task
    deferred by the retry's interval. On one without, the relay delivers the request again; then the
    request's ``attempts`` (counted in the request log) tell when the retries are spent.
    """
    attempt = current_attempt()
    if attempt is None:
        return False
    retries = int(conf.retry().get("max") or 0)
    if getattr(backend(), "supports_defer", False):
        if attempt.number >= retries:
            return False
        content_type_id, _, object_id = attempt.record.partition(":")
        try:
            deliver(
                request_id,
                int(content_type_id or 0),
                object_id,
                attempt.queue_name,
                attempt=attempt.number + 1,
                delay=retry_delay(attempt.number),
                using=attempt.using,
            )
        except Exception:
            logger.exception("safeupdates: could not enqueue the retry of request %s; the relay will", request_id)
        return True
    from safeupdates.models import ProcessedRequest

    with contextlib.suppress(Exception):  # the database is down: the failure cannot be recorded anyway
        log = ProcessedRequest.objects.using(attempt.using)
        attempts = log.filter(request_id=request_id).values_list("attempts", flat=True).first()
        return (attempts or 0) < retries
    return True
