"""Delivery through Django's Tasks framework: :class:`TasksBackend`, the apply task, coalescing and retries.

Used with ``SAFEUPDATES_DELIVERY = "tasks"``, on the ``TASKS`` backend ``SAFEUPDATES_TASK_BACKEND``.
``django.tasks`` (Django 6.0+) is used where it exists, else the ``django-tasks`` backport
(``django_tasks``, on Django 5.2): this module is imported only with tasks delivery, at start-up in every
process (:func:`safeupdates.delivery.ready`), and the framework with it: Django 6 registers its task backends'
own system checks (a backend's missing app ...) only when ``django.tasks`` is imported.

The apply task (:func:`apply_update`) carries the request id, the record's identity and an attempt number,
all JSON, never the changes (with OpenTelemetry, also the trace context of the enqueue); it runs
:func:`safeupdates.jobs.apply_update`, which applies every pending request of the record, so a duplicated
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import DEFAULT_DB_ALIAS, router
from django.db.models import Count
from django.utils import timezone
from django.utils.module_loading import import_string

from safeupdates import conf, tracing
from safeupdates.database.registry import request_log
from safeupdates.delivery import (
    APPLY_UPDATE,
    Backend,
    Delivery,
    QueueHealth,
    Redelivered,
    RunningJob,
    requires,
    retry_delay,
)
from safeupdates.exceptions import BackendUnavailable, InvalidUpdate

with requires(
    Error(
        'SAFEUPDATES_DELIVERY is "tasks", but Django\'s Tasks framework cannot be imported.',
        hint="Use Django 6.0 or later (django.tasks), or install the django-tasks backport on Django 5.2 "
        "(the [tasks] extra of django-safeupdates, or pip install django-tasks).",
        id="safeupdates.E021",
    )
):
    try:  # Django 6.0+
        from django.tasks import task, task_backends  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # Django 5.2, with the django-tasks backport
        from django_tasks import task, task_backends  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]

logger = logging.getLogger("safeupdates")

#: The apply task, by the dotted path under which workers import it (stored and queued tasks name it).
APPLY_TASK = "safeupdates.delivery.tasks.apply_update"

#: What a delivery did: enqueued a task, or found the record's task waiting.
ENQUEUED, WAITING = "enqueued", "waiting"


@dataclass(frozen=True)
class Attempt:
    """The apply task running in this thread: its request, record (``content_type_id:object_id``), attempt
    number (0 first), task result id, task queue and the database its request is in."""

    request_id: str
    record: str
    number: int
    task_id: str | None
    queue_name: str
    using: str = "default"


_current: ContextVar[Attempt | None] = ContextVar("safeupdates_task_attempt", default=None)


def current_attempt() -> Attempt | None:
    """The apply task running in this thread, or None outside one."""
    return _current.get()


@contextmanager
def running(attempt: Attempt) -> Iterator[None]:
    """Make ``attempt`` the :func:`current_attempt` inside the block."""
    token = _current.set(attempt)
    try:
        yield
    finally:
        _current.reset(token)


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
    :func:`safeupdates.jobs.apply_update`."""
    # By dotted path, as RQ jobs name it: the job path imports this module, not the other way round.
    apply = import_string(APPLY_UPDATE)
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


@dataclass(frozen=True)
class Traits:
    """What safeupdates knows of a kind of task backend: whether it ever runs a task, whether it can say
    that a record's task waits (its queued tasks can be listed), and whether its workers can be seen."""

    runs_tasks: bool = True
    lists_queued: bool = False
    heartbeats: bool = False
    #: How to start a worker of queue ``{queue}`` (its command), for the status page's advice.
    worker: str = "start the workers of the TASKS backend"


#: The task backends safeupdates knows, by the dotted path of their class (or of a base class). Any other
#: runs tasks and can tell nothing more: every request gets a task, the relay delivers from the request log
#: alone, and the status page judges by the age of the oldest pending request.
TRAITS: dict[str, Traits] = {
    # Django's own (6.0+) and the backport's (5.2).
    **dict.fromkeys(
        ("django.tasks.backends.immediate.ImmediateBackend", "django_tasks.backends.immediate.ImmediateBackend"),
        Traits(worker="the immediate backend runs a task where it is enqueued: run python manage.py safeupdates_relay"),
    ),
    **dict.fromkeys(
        ("django.tasks.backends.dummy.DummyBackend", "django_tasks.backends.dummy.DummyBackend"),
        Traits(runs_tasks=False),
    ),
    # django-tasks-db: its task rows say which tasks wait (READY); no heartbeats of its workers.
    "django_tasks_db.backend.DatabaseBackend": Traits(
        lists_queued=True, worker="python manage.py db_worker --queue-name {queue}"
    ),
    # django-tasks-rq: its workers are RQ's, registered in Redis with heartbeats.
    "django_tasks_rq.backend.RQBackend": Traits(heartbeats=True, worker="python manage.py rqworker {queue}"),
    # django-tasks-celery (Django 6.0+): a Celery message per task on the project's broker, run by `celery
    # worker` once the worker has imported the task (else Celery drops it as unregistered). A broker cannot say
    # which record's task waits, and its workers are not seen here. It defers (`run_after` as Celery's `eta`);
    # it supports priorities too, which safeupdates never sets. Queue "default" goes to the app's default queue.
    "django_tasks_celery.backend.CeleryBackend": Traits(
        worker="celery -A <your project> worker --include safeupdates.delivery.tasks -Q {queue} "
        "(django-tasks-celery sends the queue named default to the Celery app's default queue)"
    ),
}


def traits(task_backend: Any = None) -> Traits:
    """The :class:`Traits` of ``task_backend`` (default: the backend of ``SAFEUPDATES_TASK_BACKEND``), found
    by its class, never by importing what the backend itself would import (its models)."""
    for cls in type(backend() if task_backend is None else task_backend).__mro__:
        known = TRAITS.get(f"{cls.__module__}.{cls.__qualname__}")
        if known is not None:
            return known
    return Traits()


def coalesces() -> bool:
    """True if the backend can say whether a record's task is waiting (django-tasks-db's database
    backend): a burst of one record then costs one task."""
    return traits().lists_queued


def _db_results() -> Any:
    """django-tasks-db's queryset of task rows on the database they are written to, if the backend is
    its database backend; else None. Its models are imported only then: a project on another backend may
    not have its app."""
    if not traits().lists_queued:
        return None
    from django_tasks_db.models import DBTaskResult

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
    with contextlib.suppress(Exception):  # the database is down: the failure cannot be recorded anyway
        log = request_log().objects.using(attempt.using)
        attempts = log.filter(request_id=request_id).values_list("attempts", flat=True).first()
        return (attempts or 0) < retries
    return True


class TasksBackend(Backend):
    """Delivery through Django's Tasks framework, on the ``TASKS`` backend ``SAFEUPDATES_TASK_BACKEND``.

    It can tell whether a record's task is waiting only on django-tasks-db's database backend
    (:func:`coalesces`); elsewhere every request gets a task and the relay delivers from the request
    log alone. Retries: a task deferred by the back-off where the backend can defer, else the relay.
    """

    label = "the task backend"
    task_functions = "Django task functions"

    @property
    def can_list_queued(self) -> bool:  # type: ignore[override]
        return traits().lists_queued

    @property
    def has_worker_heartbeats(self) -> bool:  # type: ignore[override]
        return traits().heartbeats

    def worker_hint(self, queue: str) -> str:
        return traits().worker.format(queue=queue)

    def health(self, queues: Sequence[str] = ()) -> list[QueueHealth]:
        """django-tasks-rq: RQ's view of its queues (their workers' heartbeats); django-tasks-db: the tasks
        waiting per queue; any other backend cannot tell."""
        known = traits()
        served = sorted(getattr(backend(), "queues", None) or ())
        if known.heartbeats:
            from safeupdates.delivery import rq

            return rq.queue_states(served or sorted(getattr(settings, "RQ_QUEUES", None) or {}))
        results = _db_results()
        if results is None:
            return []
        waiting = dict(
            results.filter(status="READY", backend_name=conf.task_backend())
            .values_list("queue_name")
            .annotate(count=Count("pk"))
            .values_list("queue_name", "count")
        )
        return [QueueHealth(name, waiting.get(name, 0), None, None, None, None, None) for name in served]

    def queue_name(self, queue: str | None) -> str:
        return queue_name(queue)

    def relay_queue(self, wanted: str, what: str) -> tuple[str | None, str | None]:
        allowed = getattr(backend(), "queues", None) or set()
        if not allowed or wanted in allowed:
            return wanted, None
        queue = conf.queue_name()
        return queue, (
            f"{what} has work for task queue {wanted!r}, which is not in the QUEUES of "
            f"TASKS[{conf.task_backend()!r}]: delivered on {queue!r}."
        )

    def deliver(
        self, delivery: Delivery, *, likely_queued: bool = False, trace: dict[str, str] | None = None
    ) -> str | None:
        result, outcome = deliver(
            delivery.request_id,
            delivery.content_type_id,
            delivery.object_id,
            delivery.queue,
            using=delivery.using,
            trace=trace,
        )
        return str(result.id) if outcome == ENQUEUED else None

    def unreachable(self, error: Exception, delivery: Delivery) -> str | None:
        # Whatever the backend raises (its database or its Redis unreachable): the relay delivers it.
        return f"task backend {conf.task_backend()!r} could not take its task ({type(error).__name__}: {error})"

    def redeliver(self, deliveries: Sequence[Delivery]) -> Redelivered:
        done = Redelivered()
        for delivery in deliveries:
            try:
                _result, outcome = deliver(
                    delivery.request_id,
                    delivery.content_type_id,
                    delivery.object_id,
                    delivery.queue,
                    using=delivery.using,
                )
            except Exception as exc:
                raise BackendUnavailable(
                    f"task backend {conf.task_backend()!r}", type(backend()).__name__, exc
                ) from exc
            if outcome == WAITING:
                done.waiting += 1
            else:
                done.enqueued += 1
        return done

    def running(self) -> RunningJob | None:
        attempt = current_attempt()
        if attempt is None:
            return None
        return RunningJob(attempt.task_id, attempt.queue_name)

    def will_retry(self, request_id: uuid.UUID) -> bool:
        return will_retry(request_id)

    def check(self) -> list[CheckMessage]:
        """E022: ``SAFEUPDATES_TASK_BACKEND`` is not a ``TASKS`` alias; E024: its backend never runs a task
        (``DummyBackend``); E023: ``SAFEUPDATES_QUEUE`` is not one of its ``QUEUES``; W020: the backend has no
        deferred runs (retries come from the relay). E021, the framework cannot be imported, is this module's
        :func:`~safeupdates.delivery.requires`."""
        alias = conf.task_backend()
        configured = getattr(settings, "TASKS", None)
        aliases = set(configured) if configured is not None else {"default"}  # the framework's default backend
        if alias not in aliases:
            return [
                Error(
                    f"SAFEUPDATES_TASK_BACKEND is {alias!r}, which is not a backend in TASKS.",
                    hint=f"Add {alias!r} to TASKS or set SAFEUPDATES_TASK_BACKEND to one of: "
                    f"{', '.join(sorted(aliases)) or '(none configured)'}.",
                    id="safeupdates.E022",
                )
            ]
        chosen = backend()
        if not traits(chosen).runs_tasks:
            return [
                Error(
                    f"SAFEUPDATES_TASK_BACKEND is {alias!r}, a {type(chosen).__name__}: it keeps every task and "
                    "never runs one, so no request would ever be applied.",
                    hint="Use the ImmediateBackend in development and tests (tasks run when the transaction "
                    "commits), and a backend with workers in production (django-tasks-db's DatabaseBackend, "
                    "django-tasks-rq's RQBackend, django-tasks-celery's CeleryBackend).",
                    id="safeupdates.E024",
                )
            ]
        messages: list[CheckMessage] = []
        served = sorted(getattr(chosen, "queues", None) or ())
        queue = conf.queue_name()
        if served and queue not in served:
            messages.append(
                Error(
                    f"SAFEUPDATES_QUEUE is {queue!r}, which is not in the QUEUES of TASKS[{alias!r}].",
                    hint=f"Add {queue!r} to its QUEUES or set SAFEUPDATES_QUEUE to one of: {', '.join(served)}.",
                    id="safeupdates.E023",
                )
            )
        if not getattr(chosen, "supports_defer", False):
            messages.append(
                Warning(
                    f"The task backend {alias!r} ({type(chosen).__name__}) cannot defer a task (run_after): an "
                    "apply task that fails on a transient database error is not retried with back-off.",
                    hint="The relay (safeupdates_relay) delivers the request again, up to SAFEUPDATES_RETRY['max'] "
                    "failed attempts (counted in the request's attempts); run it, or use a backend with deferred "
                    "runs (django-tasks-db, django-tasks-rq, django-tasks-celery).",
                    id="safeupdates.W020",
                )
            )
        return messages
