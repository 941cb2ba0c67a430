"""``@idempotent``: a side effect (a refund, an email) that completes at most once per key.

The guard is a database row lock, not a queue feature (queue-level uniqueness is best-effort): the key's
row of the request log (:class:`~safeupdates.models.ProcessedRequest`, ``kind=task``) is inserted if
missing and locked with ``SELECT ... FOR UPDATE``; the body runs while the lock is held, in the same
transaction that marks the row ``applied``. A concurrent duplicate waits on the lock, then sees
``applied`` and skips. A body that raises leaves the row ``failed`` (with the error), so a later call runs
it again.

A task's row is found by its key among tasks (unique where ``kind = 'task'``), never by its request id,
which is random: request ids are chosen by clients (``enqueue_update(request_id=...)``), and no id a
client sends can collide with or squat a task's key.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import uuid
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from django.db import OperationalError, connections, router, transaction
from rq import get_current_job

from safeupdates import conf, signals
from safeupdates.contrib import require_app
from safeupdates.database.errors import is_lock_unavailable
from safeupdates.database.transactions import in_transaction, local_lock_timeout
from safeupdates.exceptions import InvalidControl, LockUnavailable
from safeupdates.managers import MAX_LOCK_TIMEOUT, Outcome
from safeupdates.models import ProcessedRequest, RequestKind, RequestStatus
from safeupdates.write.validation import has_lone_surrogate, shown

__all__ = ["SKIPPED", "TASK_NAMESPACE", "idempotent", "task_log_key"]

P = ParamSpec("P")
R = TypeVar("R")

#: What a decorated function returns when the key has already completed and the body was skipped.
SKIPPED = Outcome.DUPLICATE

#: Namespace of the digest of a key too long for the request log's ``key`` column (see
#: :func:`task_log_key`). Task rows written before migration 0006 have ``uuid5(TASK_NAMESPACE, key)`` as
#: their request id, which clients could compute: tasks are now found by key, never by request id.
TASK_NAMESPACE = uuid.UUID("8c5e2a52-3f7e-5d1b-9a64-6f1d3c0b7e21")

_KEY_LENGTH = 255
#: The longest wait for a key's lock, in whole seconds: PostgreSQL's lock_timeout and
#: idle_in_transaction_session_timeout hold at most 2**31 - 1 milliseconds.
_LONGEST_WAIT = int(MAX_LOCK_TIMEOUT)
_DIGEST_MARK = "...uuid5:"
_ERROR_LENGTH = 2000


def task_log_key(key: str) -> str:
    """The ``key`` of the request-log row of idempotency key ``key``.

    The key itself if it fits the column (255 characters); else its start, ``...uuid5:`` and the
    ``uuid5`` of the whole key, 255 characters in all: two long keys never share a row, as they would if
    truncated. (Migration 0006 gave rows of such keys written before it this form.)
    """
    if len(key) <= _KEY_LENGTH:
        return key
    digest = str(uuid.uuid5(TASK_NAMESPACE, key))
    return f"{key[: _KEY_LENGTH - len(_DIGEST_MARK) - len(digest)]}{_DIGEST_MARK}{digest}"


def idempotent(
    key: Callable[..., str] | str, *, using: str | None = None, timeout: int | None = None
) -> Callable[[Callable[P, R]], Callable[P, R | Outcome]]:
    """Make the decorated function's body complete at most once per key.

    ``key`` is a callable taking the function's arguments and returning a string, or a ``str.format``
    template over them (``"refund:{order_id}"``; positional arguments also by index). Keys are global:
    put the action in the key. The call:

    1. inserts the key's request-log row if missing and locks it (``SELECT ... FOR UPDATE``);
    2. if the row is ``applied``, returns :data:`SKIPPED` (``Outcome.DUPLICATE``) without running the body;
    3. else runs the body in a savepoint; on success marks the row ``applied`` and returns the body's
       value; if the body raises, rolls back its database writes, marks the row ``failed`` with the
       error, commits that, and re-raises: a later call runs the body again.

    A concurrent call with the same key waits for the first one's transaction, then skips (or runs, if
    the first failed). ``timeout`` (seconds; default: the current RQ job's timeout, else
    ``SAFEUPDATES_JOB_TIMEOUT``) bounds that wait through PostgreSQL's ``lock_timeout`` (then
    :class:`~safeupdates.exceptions.LockUnavailable` is raised) and, through
    ``idle_in_transaction_session_timeout``, how long the lock survives a worker that vanished without
    closing its connection. A killed worker's connection is closed by the OS, so PostgreSQL releases its
    lock at once. Database writes of the body commit with the ``applied`` mark (exactly once); effects
    outside the database happen at most once per successful run, but may repeat if the process dies after
    the effect and before the commit. Call it outside of ``transaction.atomic`` blocks, or the outcome is
    recorded only when (and if) the caller commits.

    It works on a task of Django's Tasks framework too, below ``@task`` or above it (it then returns the
    same task, running the guarded function): a task delivered twice, or retried, completes once per key.
    Its :data:`SKIPPED` is the string ``"duplicate"`` in the task's result.
    """
    if not callable(key) and not isinstance(key, str):
        raise InvalidControl(f"key must be a callable or a format string such as 'refund:{{order_id}}', not {key!r}.")
    if isinstance(key, str) and not key.strip():
        raise InvalidControl("key must not be empty; use a template such as 'refund:{order_id}'.")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
        raise InvalidControl(f"timeout must be a positive number of seconds (int), not {timeout!r}.")
    if timeout is not None and timeout > _LONGEST_WAIT:
        raise InvalidControl(
            f"timeout must be at most {_LONGEST_WAIT} seconds (PostgreSQL's longest lock_timeout), not "
            f"{shown(timeout)}."
        )

    def decorate(func: Callable[P, R]) -> Callable[P, R | Outcome]:
        if _is_django_task(func):
            # @idempotent above @task: the same task, running the guarded function.
            return dataclasses.replace(func, func=decorate(func.func))  # type: ignore[attr-defined,type-var,no-any-return]
        require_app("safeupdates.contrib.idempotent")
        signature = inspect.signature(func)
        qualname = _name_of(func)[1]

        def key_for(*args: Any, **kwargs: Any) -> str:
            if callable(key):
                value = key(*args, **kwargs)
            else:
                try:
                    bound = signature.bind(*args, **kwargs)
                except TypeError as exc:
                    raise InvalidControl(f"{qualname}{signature}: {exc}") from None
                bound.apply_defaults()
                try:
                    value = key.format(*bound.args, **bound.arguments)
                except (KeyError, IndexError, AttributeError, ValueError) as exc:
                    raise InvalidControl(f"key template {key!r} does not fit {qualname}{signature}: {exc!r}") from None
            if not isinstance(value, str) or not value:
                raise InvalidControl(f"the key of {qualname} must be a non-empty string, got {shown(value)}.")
            _check_key(qualname, value)
            return value

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | Outcome:
            require_app("safeupdates.contrib.idempotent")  # decorated before the registry could tell
            task_key = key_for(*args, **kwargs)
            return _run_once(func, task_key, args, kwargs, using=using, timeout=timeout)

        wrapper.key_for = key_for  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _check_key(qualname: str, key: str) -> None:
    """Refuse a key the request log cannot store (PostgreSQL's text takes no NUL, no encoding a lone
    surrogate), nor digest (a long key's uuid5 encodes it): often made of a client's data, it is refused
    before anything runs, not a ``DataError`` or a ``UnicodeEncodeError`` at the INSERT."""
    if "\x00" in key:
        raise InvalidControl(
            f"the key of {qualname} contains a NUL character (\\x00), which PostgreSQL cannot store: {shown(key)}. "
            "Leave it out of the key (or refuse it where the value comes from)."
        )
    if has_lone_surrogate(key):
        raise InvalidControl(
            f"the key of {qualname} contains a lone surrogate (\\ud800 to \\udfff), which no text encoding "
            f"can store: {shown(key)}. A client's JSON made it of an unpaired \\u escape: refuse or repair "
            "it there."
        )


def _is_django_task(obj: Any) -> bool:
    """True for a task of Django's Tasks framework (``django.tasks`` or the ``django_tasks`` backport): a
    dataclass with the function in ``func`` and an ``enqueue()``."""
    return (
        dataclasses.is_dataclass(obj)
        and callable(getattr(obj, "enqueue", None))
        and callable(getattr(obj, "func", None))
    )


def _name_of(func: Callable[..., Any]) -> tuple[str, str]:
    """``(module, qualified name)`` of a function; of a ``functools.partial``, of the function it wraps;
    of any other callable object (an instance with ``__call__``), of its class."""
    while isinstance(func, functools.partial):
        func = func.func
    module = getattr(func, "__module__", None) or type(func).__module__
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return str(module), str(name)


def _run_once(
    func: Callable[..., R],
    task_key: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    using: str | None,
    timeout: int | None,
) -> R | Outcome:
    alias = using or router.db_for_write(ProcessedRequest)
    connection = connections[alias]
    job = get_current_job()
    seconds = timeout or (int(job.timeout) if job is not None and job.timeout and int(job.timeout) > 0 else None)
    # A job's (or the setting's) timeout beyond what lock_timeout can hold waits as long as it can.
    seconds = min(seconds or conf.job_timeout(), _LONGEST_WAIT)
    log_key = task_log_key(task_key)
    log = ProcessedRequest.objects.using(alias)
    failure: Exception | None = None
    result: R | Outcome
    owns_transaction = not in_transaction(connection)
    with transaction.atomic(using=alias):
        # idle_in_transaction_session_timeout: a frozen holder (a stopped worker, a lost machine) loses
        # its lock after the job timeout too.
        extra = {"idle_in_transaction_session_timeout": seconds * 1000} if owns_transaction else {}
        with local_lock_timeout(alias, seconds, **extra):
            try:
                record = None
                while record is None:
                    # ON CONFLICT DO NOTHING on the task's key (the request id is random and new): a
                    # concurrent first call's uncommitted row makes this wait for it.
                    log.create_pending_rows(
                        [
                            ProcessedRequest(
                                key=log_key,
                                changes={"function": ".".join(_name_of(func))},
                                queue=job.origin if job is not None else "",
                            )
                        ],
                        kind=RequestKind.TASK,
                        ignore_conflicts=True,
                    )
                    # None only if a purge deleted the row in between: the next INSERT makes a pending
                    # row, which no purge deletes.
                    record = log.select_for_update().filter(kind=RequestKind.TASK, key=log_key).first()
            except OperationalError as exc:
                if is_lock_unavailable(exc):
                    signals.lock_unavailable.send_robust(sender=None, surface="idempotent", using=alias)
                    raise LockUnavailable(
                        f"idempotency key {task_key!r} stayed locked for {seconds}s by another run; "
                        "it is retried by RQ if the job has retries, or call again later."
                    ) from exc
                raise
        if record.status == RequestStatus.APPLIED:
            return SKIPPED
        try:
            with transaction.atomic(using=alias):
                result = func(*args, **kwargs)
        except Exception as exc:
            failure = exc
            log.filter(pk=record.pk).complete(f"{type(exc).__name__}: {exc}"[:_ERROR_LENGTH])
        else:
            log.filter(pk=record.pk).complete()
    if failure is not None:
        raise failure
    return result
