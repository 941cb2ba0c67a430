"""Where and what jobs run: the django-rq queues, and the functions given as callables or dotted paths."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import django_rq
from django.conf import settings
from rq import Queue
from rq.utils import import_attribute

from safeupdates.exceptions import InvalidControl

__all__ = ["dotted_path", "get_queue", "resolve"]


def dotted_path(func: Callable[..., Any] | str) -> str:
    """Return the dotted path by which a worker imports ``func`` (a module-level callable or a path).

    Raises :class:`~safeupdates.exceptions.InvalidControl` for what a worker could not import: lambdas,
    nested functions, functions of ``__main__``, paths that do not import or name no callable.
    """
    if isinstance(func, str):
        resolve(func)
        return func
    if not callable(func):
        raise InvalidControl(f"func must be a callable or its dotted path, not {func!r}.")
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        raise InvalidControl(
            f"{func!r} cannot be imported by a worker; pass a function defined at module level (not a lambda, "
            "a nested function or one from __main__) or its dotted path."
        )
    path = f"{module}.{qualname}"
    imported: Any = None
    with contextlib.suppress(ImportError, AttributeError, ValueError):
        imported = import_attribute(path)
    if imported is not func and imported != func:
        raise InvalidControl(f"{func!r} is not importable as {path!r}; pass a module-level function or its path.")
    return path


def resolve(path: str) -> Callable[..., Any]:
    """Import the callable at dotted ``path``."""
    try:
        target = import_attribute(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidControl(f"func {path!r} cannot be imported: {exc}") from None
    if not callable(target):
        raise InvalidControl(f"func {path!r} names {target!r}, which is not callable.")
    return target  # type: ignore[no-any-return]


_QUEUES: dict[tuple[str, str], Queue] = {}


def get_queue(name: str) -> Queue:
    """The django-rq queue ``name``, built once per configuration and reused.

    ``django_rq.get_queue()`` builds a new Redis client, and so opens a new connection, on every call:
    that connect was most of the cost of an ``enqueue_update()``. redis-py's pool is thread-safe and
    resets itself in a forked child. Enqueues happen at once (``commit_mode="auto"``): callers choose the
    moment, for example in ``on_commit``.
    """
    config = repr(settings.RQ_QUEUES.get(name))
    key = (name, config)
    queue = _QUEUES.get(key)
    if queue is None:
        queue = _QUEUES[key] = django_rq.get_queue(name, commit_mode="auto")
    return queue
