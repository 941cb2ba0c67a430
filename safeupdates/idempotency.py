"""Deprecated: the old import path of ``@idempotent``, now the app :mod:`safeupdates.contrib.idempotent`
(add it to ``INSTALLED_APPS``). A name imported from here warns (``DeprecationWarning``); the module goes
in safeupdates 0.3.0."""

from __future__ import annotations

from typing import Any

from safeupdates.deprecation import moved


def __getattr__(name: str) -> Any:
    return moved(__name__, name)
