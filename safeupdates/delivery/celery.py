"""Delivery through Celery: ``SAFEUPDATES_DELIVERY = "celery"``, :class:`CeleryBackend` and its tasks.

The apply job is a task of the project's own Celery app (``SAFEUPDATES_CELERY_APP``, default Celery's
current app: the one ``celery -A proj worker`` runs), named by a wire path that never changes,
``safeupdates.jobs.apply_update`` (the string RQ's apply jobs carry too). It is declared the way Celery
users declare at-least-once work:

- ``acks_late=True`` and ``reject_on_worker_lost=True``: a message is acknowledged once its apply has
  committed, and a worker killed mid-apply gives it back to the broker;
- retried by Celery (``Task.retry``, a new message with a countdown) on *transient* database errors only
  (:func:`safeupdates.database.errors.is_transient`), ``SAFEUPDATES_RETRY["max"]`` times with its ``interval`` as the
  back-off; a request that would fail again (bad data) is rejected at once by the apply, never retried;
- JSON only (``serializer="json"``), no result (``ignore_result=True``: no result backend is needed);
- routed to ``enqueue_update(queue=...)``'s queue, else ``SAFEUPDATES_CELERY_QUEUE``, else
  ``SAFEUPDATES_QUEUE`` where set, else the app's own default queue (:func:`default_queue`).

The message carries ids only: the request id, the record (content type id, object id), the database
alias and, with OpenTelemetry, the trace context; the attempt number is Celery's own ``retries``. Never
the changes. Its body is :func:`safeupdates.jobs.apply_update`, which applies every pending request of the
record, so a message delivered twice, or one whose request another message's task applied, changes
nothing.

One message per record in flight: the delivery notes a record's message in the database before it
publishes it (:class:`safeupdates.models.WaitingMessage`), and the message's task deletes the note when it
starts, before it reads the pending requests. A request whose record has a message waiting publishes
nothing; one committed after that message started publishes a message of its own (the follow-up). The
broker is never asked (:attr:`CeleryBackend.can_list_queued` is False): a note whose message was lost
only delays the record's next requests until the relay, which delivers from the request log alone.

Publishing happens after the caller's commit and never waits for long: one reconnect at once (a pooled
connection that a broker restart broke), then the request is left, pending, to the relay. The relay is
``manage.py safeupdates_relay`` or the periodic task ``safeupdates.jobs.relay_pending`` (a ``celery beat``
entry; see docs/delivery.md).

The tasks register with every Celery app (``shared_task``) when this module is imported: the delivery
imports it at start-up with celery delivery (:func:`safeupdates.delivery.ready`), in the web process and in
the worker (Celery's Django fix-up sets Django up before the worker consumes).

The system checks of this delivery (``safeupdates.E026`` ... ``W024``) are :meth:`CeleryBackend.check`'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar

from django.core.checks import CheckMessage, Error, Warning
from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connections, transaction
from django.utils.module_loading import import_string

from safeupdates import conf, tracing
from safeupdates.database.cursors import execute, fetch_one
from safeupdates.database.errors import is_transient
from safeupdates.database.registry import waiting_messages
from safeupdates.database.statements import waiting_message_statements
from safeupdates.database.transactions import in_transaction
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
        'SAFEUPDATES_DELIVERY is "celery", but Celery cannot be imported.',
        hint="Install it with its Redis support (the [celery] extra of django-safeupdates, or pip install "
        '"celery[redis]"), or set SAFEUPDATES_DELIVERY to "rq" or "tasks".',
        id="safeupdates.E025",
    )
):
    from celery import Celery, shared_task

logger = logging.getLogger("safeupdates")

#: The apply task's name: a wire path, the one RQ's apply jobs carry (``safeupdates.delivery.APPLY_UPDATE``).
APPLY_TASK = APPLY_UPDATE
#: The relay as a periodic task (a ``celery beat`` entry).
RELAY_TASK = "safeupdates.jobs.relay_pending"

#: How a publish after commit retries: one reconnect at once (a pooled connection that a broker restart
#: broke is replaced), no waiting. Celery's default waits and retries three times, blocking the caller
#: about 0.8 s per request while the broker is down; the relay delivers what was not published.
PUBLISH_RETRY_POLICY: dict[str, float] = {"max_retries": 1, "interval_start": 0, "interval_step": 0, "interval_max": 0}


def celery_app() -> Any:
    """The project's Celery app, ``SAFEUPDATES_CELERY_APP`` imported (a proxy such as Celery's
    ``current_app`` resolved to the app behind it). Raises ImportError if the path imports nothing."""
    app = import_string(conf.celery_app())
    resolve = getattr(app, "_get_current_object", None)  # celery.local.Proxy
    return resolve() if callable(resolve) else app


def default_queue() -> str:
    """The queue apply tasks go to when ``enqueue_update()`` names none: ``SAFEUPDATES_CELERY_QUEUE``, else
    ``SAFEUPDATES_QUEUE`` where set (:func:`safeupdates.conf.celery_queue`), else the app's
    ``task_default_queue``, which a worker started without ``-Q`` consumes."""
    return conf.celery_queue() or str(celery_app().conf.task_default_queue)


def max_retries() -> int:
    """How many times an apply task failing on a transient database error is retried (``SAFEUPDATES_RETRY``)."""
    return int(conf.retry().get("max") or 0)


def longest_apply() -> float:
    """Seconds a message of the apply task can stay unacknowledged: a retry's message waits its back-off
    reserved by a worker (an ETA task), then runs for up to ``SAFEUPDATES_JOB_TIMEOUT`` (the task's hard
    time limit, which also bounds any lock wait inside it)."""
    retries = max_retries()
    longest_wait = max((retry_delay(number) for number in range(retries)), default=0.0)
    return float(conf.job_timeout()) + longest_wait


# -- the running task ---------------------------------------------------------------------------------


@dataclass
class _Running:
    """The apply task this thread runs: what the job path asks of it (:meth:`CeleryBackend.running`)."""

    job: RunningJob
    retries: int
    no_retry: bool = False


_current: ContextVar[_Running | None] = ContextVar("safeupdates_celery_task", default=None)


@contextmanager
def _running(state: _Running) -> Iterator[None]:
    token = _current.set(state)
    try:
        yield
    finally:
        _current.reset(token)


def _retries(state: _Running, error: BaseException | None) -> bool:
    """Whether the running task ``state``, failing with ``error``, is retried by Celery: a transient
    database error, with retries left."""
    return (
        not state.no_retry
        and isinstance(error, DatabaseError)
        and is_transient(error)
        and state.retries < max_retries()
    )


# -- one message per record in flight ------------------------------------------------------------------


def _claim(delivery: Delivery, task_id: str) -> bool:
    """Note that ``delivery``'s record has an apply message waiting, to be published as ``task_id``
    (:class:`safeupdates.models.WaitingMessage`, in the request's database): True if this delivery is to
    publish it, False if one waits already, published and not started, which will read the request
    (committed before this call). One statement (an insert that does nothing on a conflict), in autocommit
    after the caller's commit. A database error here is no reason to publish nothing: True."""
    note, _forget = waiting_message_statements()
    connection = connections[delivery.using]
    # A savepoint only in the caller's transaction (an error then leaves it usable); none in autocommit.
    savepoint = transaction.atomic(using=delivery.using) if in_transaction(connection) else contextlib.nullcontext()
    try:
        with savepoint:
            noted = fetch_one(connection, note, [delivery.content_type_id, delivery.object_id, task_id])
        return noted is not None
    except DatabaseError:
        logger.warning(
            "safeupdates: record %s: its waiting message could not be noted; published all the same.",
            delivery.record,
            exc_info=True,
        )
    return True


def _unclaim(delivery: Delivery, task_id: str) -> None:
    """A publish that failed: the record has no message waiting after all (best effort: a note left behind
    only makes later requests of the record wait for the relay)."""
    with contextlib.suppress(DatabaseError):
        waiting_messages().objects.using(delivery.using).filter(
            content_type_id=delivery.content_type_id, object_id=delivery.object_id, task_id=task_id
        ).delete()


def _started(using: str, content_type_id: int, object_id: str) -> None:
    """The record's apply task starts: its message no longer waits. Deleted (committed: one statement in
    autocommit) before the task reads the pending requests, so that a request whose delivery found the
    note is read by this task, and one whose delivery comes later publishes a message of its own (the
    follow-up)."""
    _note, forget = waiting_message_statements()
    connection = connections[using]
    with transaction.atomic(using=using) if in_transaction(connection) else contextlib.nullcontext():
        execute(connection, forget, [content_type_id, object_id])


def run_apply_update(
    self: Any,
    request_id: str,
    content_type_id: int | None = None,
    object_id: str = "",
    using: str = DEFAULT_DB_ALIAS,
    trace: dict[str, str] | None = None,
    relayed: bool = False,
) -> str:
    """Celery task: apply pending request ``request_id`` and every other pending request of its record
    (``content_type_id``, ``object_id``), in database ``using``; ``trace`` is the trace context of the
    ``enqueue_update()`` that queued it, if any. See :func:`safeupdates.jobs.apply_update`. A transient
    database error is retried by Celery with the back-off of ``SAFEUPDATES_RETRY``; on the last try the
    apply marks the request ``failed``.

    It first deletes its record's note of a waiting message (:func:`_started`). Every message reads the
    request log: no memory of the worker skips a request the log says is pending (a request id recorded
    again after a purge, a request back to pending after the database lost the apply's commit).
    ``relayed`` (set by the relay of earlier versions) changes nothing."""
    # By dotted path: the job path imports the delivery, never the other way round.
    apply = import_string(APPLY_TASK)
    request = self.request
    queue = (request.delivery_info or {}).get("routing_key")
    state = _Running(RunningJob(request.id, queue, trace), int(request.retries or 0))
    _tidy_connections(request)
    try:
        if content_type_id is not None:
            _started(using, content_type_id, object_id)
        with _running(state), tracing.continue_trace(trace):
            return str(apply(request_id, using=using))
    except DatabaseError as exc:
        if not _retries(state, exc):
            raise
        _tidy_connections(request)  # a connection the error left unusable is not the retry's
        # A new message, with Celery's retries + 1 and a countdown; this one is acknowledged. Should the
        # broker be unreachable now, Celery rejects this message: the request stays pending (its failed
        # attempt counted) and the relay delivers it.
        raise self.retry(exc=exc, countdown=retry_delay(state.retries), max_retries=max_retries()) from exc
    finally:
        _tidy_connections(request)


def _tidy_connections(request: Any) -> None:
    """As Django around a request, and as Celery's fix-up around a task that is not eager (one run in the
    caller's process may be inside its transaction): a connection Celery kept (``CELERY_DB_REUSE_MAX``;
    its fix-up closes them otherwise) lives as ``CONN_MAX_AGE`` says, and one that an error left unusable
    or that died (``CONN_HEALTH_CHECKS``) is replaced."""
    if not getattr(request, "is_eager", False):
        close_old_connections()


#: The apply task, registered with every Celery app (check ``safeupdates.E027`` says if another task took its name).
apply_update = shared_task(
    name=APPLY_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    serializer="json",
)(run_apply_update)


@shared_task(name=RELAY_TASK, ignore_result=True, serializer="json")  # type: ignore[untyped-decorator,misc,unused-ignore]
def relay_pending(older_than: float | None = None) -> int:
    """Celery task for ``celery beat``: one pass of the relay (:func:`safeupdates.jobs.relay_pending`);
    returns how many jobs it enqueued."""
    relay = import_string(RELAY_TASK)
    return int(relay(older_than))


# -- the backend --------------------------------------------------------------------------------------


class CeleryBackend(Backend):
    """Delivery through the project's Celery app; see the module's docstring."""

    label: ClassVar[str] = "the Celery broker"
    task_functions: ClassVar[str] = "Celery task functions"
    no_worker: ClassVar[str] = "no worker consumes it: none runs, or none was started with -Q for it"
    can_list_queued: ClassVar[bool] = False
    has_worker_heartbeats: ClassVar[bool] = False

    def queue_name(self, queue: str | None) -> str:
        """``queue``, else ``SAFEUPDATES_CELERY_QUEUE``. With ``task_create_missing_queues`` off (Celery's
        default is on), it must be one of the app's ``task_queues``."""
        name = queue or default_queue()
        served = self._served()
        if served is not None and name not in served:
            choices = ", ".join(sorted(served)) or "(none configured)"
            raise InvalidUpdate(
                f"queue {name!r} is not in the task_queues of the Celery app, which creates no missing queues "
                f"(task_create_missing_queues = False); pass one of: {choices}."
            )
        return name

    def relay_queue(self, wanted: str, what: str) -> tuple[str | None, str | None]:
        """``wanted``, or ``SAFEUPDATES_CELERY_QUEUE`` with a warning if the app serves only its
        ``task_queues`` and ``wanted`` is not one of them."""
        served = self._served()
        if served is None or wanted in served:
            return wanted, None
        queue = default_queue()
        return queue, (
            f"{what} has work for Celery queue {wanted!r}, which is not in the task_queues of the Celery app: "
            f"delivered on {queue!r}."
        )

    def _served(self) -> set[str] | None:
        """The queues the app serves, or None if it creates any queue it is asked for."""
        app = celery_app()
        if app.conf.task_create_missing_queues:
            return None
        return set(app.amqp.queues)

    def deliver(
        self, delivery: Delivery, *, likely_queued: bool = False, trace: dict[str, str] | None = None
    ) -> str | None:
        """Publish an apply task for ``delivery`` and return its id, unless the record has one waiting
        (published, not started: see :class:`~safeupdates.models.WaitingMessage`), which reads the request:
        None. Raises what the broker raises when it is unreachable (kombu's ``OperationalError``), after one
        reconnect at once; the record then has no message waiting."""
        task_id = str(uuid.uuid4())
        if not _claim(delivery, task_id):
            return None
        try:
            return self._publish(delivery, trace=trace, task_id=task_id)
        except BaseException:
            _unclaim(delivery, task_id)
            raise

    def _publish(self, delivery: Delivery, *, trace: dict[str, str] | None = None, task_id: str | None = None) -> str:
        """Publish an apply task for ``delivery`` (as ``task_id``, else a new id); its task id."""
        kwargs: dict[str, Any] = {
            "content_type_id": delivery.content_type_id,
            "object_id": delivery.object_id,
            "using": delivery.using,
        }
        if trace:
            kwargs["trace"] = trace
        timeout = conf.job_timeout()
        sent = celery_app().send_task(
            APPLY_TASK,
            args=(str(delivery.request_id),),
            kwargs=kwargs,
            queue=delivery.queue,
            serializer="json",
            time_limit=timeout or None,
            retry=True,
            retry_policy=PUBLISH_RETRY_POLICY,
            ignore_result=True,
            task_id=task_id,
        )
        return str(sent.id)

    def unreachable(self, error: Exception, delivery: Delivery | None = None) -> str | None:
        """If ``error`` is a connection error of the broker's transport or kombu's ``OperationalError``
        (what a publish raises once its retries are spent): the broker's URL (password masked), in words."""
        where = _broker_down(error)
        return (
            None if where is None else f"the Celery broker at {where} is unreachable ({type(error).__name__}: {error})"
        )

    def redeliver(self, deliveries: Sequence[Delivery]) -> Redelivered:
        """One message per record of ``deliveries`` (each a request pending for too long), whatever
        :class:`~safeupdates.models.WaitingMessage` says: its message may be lost (a broker restarted empty),
        and the relay's message deletes the row when it starts. Raises ``BackendUnavailable`` if the broker
        cannot be reached."""
        done = Redelivered()
        for delivery in deliveries:
            try:
                self._publish(delivery)
            except Exception as exc:
                where = _broker_down(exc)
                if where is None:
                    raise
                raise BackendUnavailable("Celery broker", where, exc) from exc
            done.enqueued += 1
        return done

    def running(self) -> RunningJob | None:
        state = _current.get()
        return None if state is None else state.job

    def will_retry(self, request_id: uuid.UUID) -> bool:
        """True if Celery will run the apply task again: called by the apply while it handles the transient
        database error it is failing with (the error is read from there), with retries left."""
        state = _current.get()
        if state is None:
            return False
        return _retries(state, sys.exc_info()[1])

    def fail_without_retry(self) -> None:
        state = _current.get()
        if state is not None:
            state.no_retry = True

    def health(self, queues: Sequence[str] = ()) -> list[QueueHealth]:
        """The apply tasks' default queue and each of ``queues`` (those with pending requests): messages
        waiting in it and its consumers. RabbitMQ counts a queue's consumers (workers' pool connections, one
        per worker); kombu's Redis transport cannot, so there the workers are asked which queues they
        consume (``inspect().active_queues()``, which waits :data:`INSPECT_TIMEOUT` for their answers).
        Raises ``BackendUnavailable`` if the broker cannot be reached."""
        names = sorted({default_queue(), *queues})
        app = celery_app()
        try:
            with app.connection_for_read() as connection:
                connection.ensure_connection(max_retries=1)
                depths = _depths(connection, names)
                counted = _counts_consumers(connection)
            consumers = {name: depths[name][1] for name in names} if counted else _consumers_answered(app)
        except Exception as exc:
            where = _broker_down(exc)
            if where is None:
                raise
            raise BackendUnavailable("Celery broker", where, exc) from exc
        return [QueueHealth(name=name, queued=depths[name][0], workers=consumers.get(name, 0)) for name in names]

    def worker_hint(self, queue: str) -> str:
        path = conf.celery_app()
        project = path.rpartition(".")[0] if path != conf.DEFAULT_CELERY_APP else "<your project>"
        return f"celery -A {project} worker -Q {queue}"

    def check(self) -> list[CheckMessage]:
        """E026: ``SAFEUPDATES_CELERY_APP`` names no Celery app (or only Celery's fallback app: the project's
        app was never imported); E027: the app does not register safeupdates' apply task under its name;
        E028: the app's ``accept_content`` refuses JSON, the apply task's serializer; W022: ``accept_content``
        or ``task_serializer`` allows pickle; W023: a Redis broker whose ``visibility_timeout`` is shorter
        than the longest apply task; W024: the apply tasks' queue is one a worker started without ``-Q``
        does not consume. Read from the app's configuration; the broker is not connected to."""
        path = conf.celery_app()
        try:
            app = celery_app()
        except ImportError as exc:
            found = f"cannot be imported ({exc})"
        else:
            found = _not_a_celery_app(app)
        if found:
            return [
                Error(
                    f"SAFEUPDATES_CELERY_APP is {path!r}, which {found}.",
                    hint="Name your project's Celery app (SAFEUPDATES_CELERY_APP = 'proj.celery.app'), or import it "
                    "in your project package's __init__.py, as Celery's Django guide does, so that it is Celery's "
                    "current app (the default, 'celery.current_app').",
                    id="safeupdates.E026",
                )
            ]
        messages: list[CheckMessage] = []
        task = app.tasks.get(APPLY_TASK)
        if getattr(type(task), "__wrapped__", None) is not run_apply_update:
            other = "no task" if task is None else f"another task ({type(task).__module__}.{type(task).__qualname__})"
            messages.append(
                Error(
                    f"The Celery app {app.main!r} has {other} under the name {APPLY_TASK!r}, which safeupdates' "
                    "apply task must have.",
                    hint="Let safeupdates register it: keep 'safeupdates' in INSTALLED_APPS (its app config imports "
                    "safeupdates.delivery.celery with celery delivery), and rename any task of yours with that name.",
                    id="safeupdates.E027",
                )
            )
        accepted = {str(name).lower() for name in (app.conf.accept_content or ())}
        if not accepted & {"json", "application/json"}:
            messages.append(
                Error(
                    f"The Celery app {app.main!r} accepts {sorted(accepted)} (accept_content), not JSON: its workers "
                    "would refuse every apply task, whose messages are JSON.",
                    hint="Add 'json' to accept_content (CELERY_ACCEPT_CONTENT with the CELERY settings namespace).",
                    id="safeupdates.E028",
                )
            )
        serializers = (("accept_content", accepted), ("task_serializer", {str(app.conf.task_serializer)}))
        pickle = sorted(
            setting for setting, values in serializers if values & {"pickle", "application/x-python-serialize"}
        )
        if pickle:
            messages.append(
                Warning(
                    f"The Celery app {app.main!r} allows pickle ({' and '.join(pickle)}): anyone who can publish to "
                    "its broker can run code in its workers.",
                    hint="Use JSON: accept_content = ['json'], task_serializer = 'json' (Celery's defaults). "
                    "safeupdates' tasks are JSON whatever these say.",
                    id="safeupdates.W022",
                )
            )
        return [*messages, *_check_visibility_timeout(app), *_check_queue(app)]


def _broker_down(error: BaseException) -> str | None:
    """The broker's URL (password masked) if ``error`` says the broker cannot be reached; else None."""
    from kombu.exceptions import OperationalError

    connection = celery_app().connection_for_write()
    if not isinstance(error, (OperationalError, OSError, *connection.connection_errors)):
        return None
    return str(connection.as_uri())


def _not_a_celery_app(app: Any) -> str:
    """Why ``app`` is not the project's Celery app, or "" if it is one."""
    if not isinstance(app, Celery):
        return f"is {type(app).__name__}, not a Celery app"
    # Celery's fallback when no app was made current: main "default", no fix-ups (not Django's either).
    if app.main == "default" and not app.fixups:
        return "is Celery's fallback app: no Celery app of the project was created before it was asked for"
    return ""


#: kombu's Redis transport redelivers a message left unacknowledged for this long (its default).
KOMBU_VISIBILITY_TIMEOUT = 3600


def _check_visibility_timeout(app: Any) -> list[CheckMessage]:
    """W023: on a Redis broker, a message that stays unacknowledged longer than ``visibility_timeout`` is
    delivered again (kombu restores it), while the first delivery still runs."""
    connection = app.connection_for_write()
    if str(connection.transport.driver_type) != "redis":
        return []
    options = app.conf.broker_transport_options or {}
    timeout = float(options.get("visibility_timeout", KOMBU_VISIBILITY_TIMEOUT))
    longest = longest_apply()
    if timeout > longest:
        return []
    wait = longest - conf.job_timeout()
    return [
        Warning(
            f"The Celery broker is Redis with a visibility_timeout of {timeout:g} s, not more than the longest apply "
            f"task ({longest:g} s: SAFEUPDATES_JOB_TIMEOUT {conf.job_timeout()} s, after a retry's back-off of up to "
            f"{wait:g} s): Redis would deliver its message again while the first delivery still runs.",
            hint=f"Set broker_transport_options = {{'visibility_timeout': {math.ceil(longest * 2)}}} or more "
            "(CELERY_BROKER_TRANSPORT_OPTIONS with the CELERY settings namespace), or lower SAFEUPDATES_JOB_TIMEOUT.",
            id="safeupdates.W023",
        )
    ]


def _check_queue(app: Any) -> list[CheckMessage]:
    """W024: apply tasks go to a queue that a worker started without ``-Q`` does not consume: neither the
    app's ``task_default_queue`` nor one of its ``task_queues``."""
    queue = conf.celery_queue()
    default = str(app.conf.task_default_queue)
    if queue is None:
        return []  # the app's default queue
    declared = {str(getattr(entry, "name", entry)) for entry in (app.conf.task_queues or ())}
    if queue == default or queue in declared:
        return []
    return [
        Warning(
            f"Apply tasks go to the Celery queue {queue!r} (SAFEUPDATES_CELERY_QUEUE, else SAFEUPDATES_QUEUE), "
            f"which the Celery app {app.main!r} neither uses by default (task_default_queue {default!r}) nor "
            "declares in task_queues: a worker started without -Q never consumes it.",
            hint=f"Start the workers with -Q {queue} (or -Q {queue},{default}), or set SAFEUPDATES_CELERY_QUEUE = "
            f"{default!r}.",
            id="safeupdates.W024",
        )
    ]


#: Seconds ``safeupdates_status`` waits for the workers' answers on a Redis broker (Celery's inspect default: 1).
INSPECT_TIMEOUT = 1.0


def _depths(connection: Any, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``{queue: (messages waiting, consumers)}`` of each of ``names``, by a passive declare (a queue that
    does not exist yet: nothing waits in it, nobody consumes it)."""
    depths: dict[str, tuple[int, int]] = {}
    channel = connection.channel()
    for name in names:
        try:
            _name, queued, consumers = channel.queue_declare(queue=name, passive=True)
        except connection.channel_errors:
            queued, consumers = 0, 0
            channel = connection.channel()  # AMQP closes a channel whose passive declare found no queue
        depths[name] = (int(queued), int(consumers))
    return depths


def _consumers_answered(app: Any) -> dict[str, int]:
    """``{queue: workers consuming it}``, as the live workers answer (Celery's remote control); a worker
    that does not answer within :data:`INSPECT_TIMEOUT` is not counted."""
    answers = app.control.inspect(timeout=INSPECT_TIMEOUT).active_queues() or {}
    counts: dict[str, int] = {}
    for consumed in answers.values():
        for name in {str(queue.get("name")) for queue in consumed or ()}:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _counts_consumers(connection: Any) -> bool:
    """Whether the broker counts a queue's consumers (AMQP does; kombu's Redis transport does not)."""
    return str(connection.transport.driver_type) == "amqp"
