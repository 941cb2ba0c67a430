"""Resolving the functions that jobs run, given as callables or dotted paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from safeupdates.exceptions import InvalidUpdate


def dotted_path(func: Callable[..., Any] | str) -> str:
    """Return the importable dotted path of ``func``; refuse what a worker could not import."""
    if isinstance(func, str):
        path = func
    elif callable(func) and getattr(func, "__module__", None) and getattr(func, "__qualname__", None):
        if "<" in func.__qualname__:  # lambdas and nested functions
            raise InvalidUpdate(f"{func!r} cannot be imported by a worker; use a module-level function.")
        path = f"{func.__module__}.{func.__qualname__}"
    else:
        raise InvalidUpdate(f"expected a function or a dotted path, got {func!r}.")
    resolve(path)
    return path


def resolve(path: str) -> Callable[..., Any]:
    """Import the function at ``path``."""
    try:
        func = import_string(path)
    except ImportError as exc:
        raise InvalidUpdate(f"cannot import {path!r}: {exc}") from exc
    if not callable(func):
        raise InvalidUpdate(f"{path!r} is not callable.")
    return func  # type: ignore[no-any-return]
