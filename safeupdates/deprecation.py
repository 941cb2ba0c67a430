"""Old import paths, kept with a ``DeprecationWarning`` until :data:`REMOVED_IN`.

Two kinds of old path, one table each:

- names that left a module that is still there (:data:`MOVED`: ``safeupdates.fan_out`` ...), served by
  that module's ``__getattr__``;
- modules that are gone from the tree (:data:`MOVED_MODULES`: the job tools' old modules, and the flat
  modules that the wings replaced: ``safeupdates.queues`` is :mod:`safeupdates.delivery.rq` now ...). No
  file stands for them: :func:`install` (run when ``safeupdates`` is imported) puts a finder on
  ``sys.meta_path`` that makes each one, on import, a module whose every name warns and comes from its new
  home. The top level of the package holds its public face only.

Dotted paths on the wire keep working without a warning in a worker that turns warnings into errors:
jobs queued under an old job tool path run the function at its new path and log that they are old
(:func:`queued_job`), and the apply task of Django's Tasks framework, whose wire path is
``safeupdates.taskqueue.apply_update`` (stored and queued tasks name it), is served as it is.

This is the one core module that names contrib modules (tests/test_layout.py), and it goes with the old
paths: importing the core loads nothing of contrib, and an old name loads only what its new home would.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["MOVED", "MOVED_MODULES", "QUEUED_JOBS", "REMOVED_IN", "WIRE_PATHS", "install", "moved", "queued_job"]

logger = logging.getLogger("safeupdates")

#: The release that removes the old import paths.
REMOVED_IN = "0.3.0"

_BATCHES = "safeupdates.contrib.batches.jobs"
_CONTROLS = "safeupdates.contrib.controls.jobs"
_IDEMPOTENT = "safeupdates.contrib.idempotent.decorators"

#: Names that left a module that is still there: module -> {name: the module that defines it now}.
MOVED: dict[str, dict[str, str]] = {
    "safeupdates": {"enqueue": _CONTROLS, "fan_out": _BATCHES, "idempotent": _IDEMPOTENT},
    "safeupdates.models": dict.fromkeys(("Batch", "BatchStatus"), "safeupdates.contrib.batches.models"),
    "safeupdates.lifecycle": {"newest_per_field": "safeupdates.write.merge"},
    "safeupdates.delivery": dict.fromkeys(("Attempt", "current_attempt", "running"), "safeupdates.delivery.tasks"),
}

#: Modules gone from the tree: old module -> (where its names are now, {name: elsewhere, for those that
#: went another way, ``module:new_name`` for one renamed}). A name found in neither is an
#: ``AttributeError``, as a module's own lookup raises.
MOVED_MODULES: dict[str, tuple[str, dict[str, str]]] = {
    # The job tools, now apps of safeupdates.contrib.
    "safeupdates.batches": (_BATCHES, {}),
    "safeupdates.controls": (_CONTROLS, {"InvalidControl": "safeupdates.exceptions"}),
    "safeupdates.idempotency": (_IDEMPOTENT, {}),
    # The flat modules of 0.1, now in the wings.
    "safeupdates.base": ("safeupdates.write.mixins", {"SafeUpdateModel": "safeupdates.models"}),
    "safeupdates.guard": (
        "safeupdates.write.guard",
        {
            "statement_cursor": "safeupdates.database.cursors",
            **dict.fromkeys(
                (
                    *("BASE_VERSION_KEY", "SAVE_VERSION_CTE", "SUPPORTED_VENDORS", "GuardedUpdate"),
                    *("guarded_update", "saved_versions", "stored_version"),
                ),
                "safeupdates.database.statements",
            ),
            **dict.fromkeys(
                ("column", "concrete_field", "spans_tables", "versions_model"), "safeupdates.database.registry"
            ),
        },
    ),
    "safeupdates.bulk": ("safeupdates.write.bulk", {}),
    "safeupdates.validation": ("safeupdates.write.validation", {}),
    "safeupdates.meta": ("safeupdates.database.registry", {}),
    "safeupdates.statements": ("safeupdates.database.statements", {}),
    "safeupdates.internals": ("safeupdates.database.internals", {}),
    "safeupdates.db": (
        "safeupdates.database.transactions",
        {
            **dict.fromkeys(("database_now", "older_than"), "safeupdates.database.clock"),
            **dict.fromkeys(("LOCK_NOT_AVAILABLE", "is_lock_unavailable"), "safeupdates.database.errors"),
        },
    ),
    "safeupdates.enqueuing": ("safeupdates.pipeline.enqueue", {}),
    "safeupdates.apply": (
        "safeupdates.pipeline.apply",
        dict.fromkeys(("describe_database", "is_transient"), "safeupdates.database.errors"),
    ),
    "safeupdates.relay": ("safeupdates.pipeline.relay", {"unreachable_database": "safeupdates.database.errors"}),
    "safeupdates.queues": ("safeupdates.delivery.rq", {"QueueState": "safeupdates.delivery:QueueHealth"}),
    "safeupdates.taskqueue": ("safeupdates.delivery.tasks", {}),
    "safeupdates.attempts": ("safeupdates.delivery.tasks", {"current_job_id": "safeupdates.delivery"}),
    "safeupdates.admin_log": ("safeupdates.admin.requestlog", {}),
    "safeupdates.admin_status": ("safeupdates.admin.status", {}),
}

#: Job functions that jobs queued by an older release name, by their old dotted path: they run the
#: function at its new path (:func:`queued_job`), imported without a warning.
QUEUED_JOBS: dict[str, Sequence[str]] = {
    "safeupdates.batches": ("run_batch_item", "run_batch_reduce"),
    "safeupdates.controls": ("controlled_call", "reap_if_abandoned"),
}

#: Dotted paths on the wire that are current, not deprecated: served as they are, without a warning.
WIRE_PATHS: dict[str, Sequence[str]] = {
    # The apply task of Django's Tasks framework declares this as its module path.
    "safeupdates.taskqueue": ("apply_update",),
}


def _new_home(module: str, name: str, *, look: bool = True) -> tuple[str, str] | None:
    """The module that defines old ``module.name`` now, and its name there; None if it never was there.
    ``look=False``: a name known to be there (a queued job's), without importing its module yet."""
    target = MOVED.get(module, {}).get(name)
    if target is None and module in MOVED_MODULES:
        default, elsewhere = MOVED_MODULES[module]
        target = elsewhere.get(name)
        if (
            target is None
            and not name.startswith("__")
            and (not look or hasattr(importlib.import_module(default), name))
        ):
            target = default
    if target is None:
        return None
    new_module, _, new_name = target.partition(":")
    return new_module, new_name or name


def _app_of(module: str) -> str:
    """`` (with 'APP' in INSTALLED_APPS)`` for a module of a contrib app; nothing for a core module."""
    parts = module.split(".")
    return f" (with {'.'.join(parts[:3])!r} in INSTALLED_APPS)" if parts[1:2] == ["contrib"] else ""


def moved(module: str, name: str) -> Any:
    """What ``module.name`` named, from its new module, with a ``DeprecationWarning`` that says where it
    is now; ``AttributeError`` for a name that never was there (what a module's own lookup raises)."""
    home = _new_home(module, name)
    if home is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    target, new_name = home
    if name not in WIRE_PATHS.get(module, ()):
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in safeupdates {REMOVED_IN}: import {new_name} "
            f"from {target} instead{_app_of(target)}.",
            DeprecationWarning,
            stacklevel=3,  # the line that used the old name: moved() <- the old module's __getattr__ <- it
        )
    return getattr(importlib.import_module(target), new_name)


def queued_job(module: str, name: str) -> Callable[..., Any]:
    """The job function at old dotted path ``module.name``, for jobs queued under it before the move:
    runs the function at its new path.

    A worker imports it without a warning: a ``DeprecationWarning`` turned into an error
    (``-W error::DeprecationWarning``) would fail the job. Each run logs a warning instead, so that an
    operator sees whether old jobs are still queued before upgrading to the release that removes them.
    """
    # Not imported before the job runs: the old module imports without the tool's app, as it always did.
    home = _new_home(module, name, look=False)
    assert home is not None, f"{module}.{name}"
    target = home[0]

    def run(*args: Any, **kwargs: Any) -> Any:
        logger.warning(
            "safeupdates: a job queued under the old path %s.%s runs %s.%s; safeupdates %s removes the old "
            "paths: let such jobs drain from the queues before upgrading to it.",
            module,
            name,
            target,
            name,
            REMOVED_IN,
        )
        return getattr(importlib.import_module(target), name)(*args, **kwargs)

    run.__module__, run.__name__, run.__qualname__ = module, name, name
    run.__doc__ = f"Job queued under the old path {module}.{name}: runs {target}.{name} (removed in {REMOVED_IN})."
    return run


class _OldModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of :data:`MOVED_MODULES`, which have no file, and makes each a module whose names
    come from their new homes (:func:`moved`)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        default, _elsewhere = MOVED_MODULES[name]
        module.__doc__ = f"Deprecated: {name} is {default} now; this path goes in safeupdates {REMOVED_IN}."
        module.__getattr__ = lambda attr: moved(name, attr)  # type: ignore[method-assign]
        for job in QUEUED_JOBS.get(name, ()):
            setattr(module, job, queued_job(name, job))


_FINDER = _OldModules()


def install() -> None:
    """Let the old modules of :data:`MOVED_MODULES` be imported (once per process)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
