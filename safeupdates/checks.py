"""System checks of safeupdates (``safeupdates.E001`` ...), run by ``manage.py check``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import FieldDoesNotExist

from safeupdates import conf


@register(Tags.compatibility)
def check_django_rq(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E001: django_rq must be installed; E002: ``SAFEUPDATES_QUEUE`` must be one of ``RQ_QUEUES``."""
    from safeupdates.queues import queue_problem

    problem = queue_problem()
    if problem is None:
        return []
    message, hint, check_id = problem
    return [Error(message, hint=hint, id=check_id)]


def reserved_change_names() -> dict[str, tuple[str, ...]]:
    """Names that ``enqueue_update(**changes)`` / ``update_if_newer(**changes)`` take as their own
    keyword arguments, never as changes: ``{name: (functions...)}``, read from their signatures."""
    from safeupdates.jobs import enqueue_update
    from safeupdates.managers import SafeUpdateQuerySetMixin

    names: dict[str, tuple[str, ...]] = {}
    for func in (enqueue_update, SafeUpdateQuerySetMixin.update_if_newer):
        for parameter in inspect.signature(func).parameters.values():
            # A positional-only parameter's name is free for **changes (update_if_newer's pk).
            if parameter.name != "self" and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                names[parameter.name] = (*names.get(parameter.name, ()), func.__name__)
    return names


def _check_reserved_names(model: type[Any]) -> list[CheckMessage]:
    """E006 for a name of ``safe_update_fields``, W003 for another field of a model with the manager."""
    from safeupdates.validation import MANAGED_FIELDS

    reserved = reserved_change_names()
    messages: list[CheckMessage] = []
    listed = set(getattr(model, "safe_update_fields", ()))
    for name in sorted(listed & reserved.keys()):
        functions = " and ".join(f"{func}()" for func in reserved[name])
        messages.append(
            Error(
                f"{model._meta.label}.safe_update_fields names {name!r}, which is also a keyword argument of "
                f"{functions}: {name}=... would be taken as that argument, never as a change of the field.",
                hint=f"Rename the field (db_column={name!r} keeps its column) and list the new name.",
                obj=model,
                id="safeupdates.E006",
            )
        )
    if model._meta.proxy or not any(hasattr(manager, "update_if_newer") for manager in model._meta.managers):
        return messages
    for field in model._meta.concrete_fields:
        name = field.name
        if name in listed or field.primary_key or name in MANAGED_FIELDS:
            continue
        if "update_if_newer" in reserved.get(name, ()):
            messages.append(
                Warning(
                    f"{model._meta.label}.{name} has the name of a keyword argument of update_if_newer(), which "
                    "therefore cannot change it.",
                    hint=f"Rename the field (db_column={name!r} keeps its column), or write it with save().",
                    obj=model,
                    id="safeupdates.W003",
                )
            )
    return messages


@register(Tags.models)
def check_models(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W001: a ``SafeUpdateModel`` without ``safe_update_fields``; E003: a name there is not updatable;
    E006 / W003: a field named like a keyword argument of ``enqueue_update()`` or ``update_if_newer()``;
    E007: a composite primary key; E008: a field that replaces a version field of the mixin."""
    from safeupdates.models import SafeUpdateModel
    from safeupdates.validation import writable_field

    messages: list[CheckMessage] = []
    configs = app_configs if app_configs is not None else apps.get_app_configs()
    for config in configs:
        for model in config.get_models():
            messages += _check_reserved_names(model)
            messages += _check_primary_key(model)
            messages += _check_version_fields(model)
            if not issubclass(model, SafeUpdateModel):
                continue
            names = getattr(model, "safe_update_fields", ())
            if not names:
                messages.append(
                    Warning(
                        f"{model._meta.label} has no safe_update_fields, so enqueue_update() refuses every field.",
                        hint="Name the fields queued jobs may change, e.g. safe_update_fields = ('active',).",
                        obj=model,
                        id="safeupdates.W001",
                    )
                )
            for name in names:
                try:
                    writable_field(model, name)
                except Exception as exc:
                    messages.append(
                        Error(
                            f"{model._meta.label}.safe_update_fields names {name!r}, which cannot be updated: {exc}",
                            hint="List concrete, non-primary-key fields only.",
                            obj=model,
                            id="safeupdates.E003",
                        )
                    )
    return messages


def _check_primary_key(model: type[Any]) -> list[CheckMessage]:
    """E007: a ``LockVersionMixin`` model with a composite primary key (Django 5.2+)."""
    from safeupdates.models import LockVersionMixin

    if not issubclass(model, LockVersionMixin) or not getattr(model._meta, "is_composite_pk", False):
        return []
    return [
        Error(
            f"{model._meta.label} has a composite primary key, which safeupdates does not support: its guarded "
            "writes, request log and jobs address a row by one key.",
            hint="Give the model a single-column primary key (keep the pair unique with a UniqueConstraint).",
            obj=model,
            id="safeupdates.E007",
        )
    ]


#: What ``LockVersionMixin`` keeps in each of its fields, for E008.
_VERSION_FIELDS = {
    "lock_version": "the row's version (a 64-bit integer from the version source)",
    "field_versions": "the version of each field's last write (a JSON object)",
}


def _check_version_fields(model: type[Any]) -> list[CheckMessage]:
    """E008: a ``LockVersionMixin`` model declares its own ``lock_version`` or ``field_versions`` of
    another type (Django lets a model replace a field of an abstract base); a subclass of the mixin's
    field type is fine. Reported on the model that declares the field, not on its subclasses."""
    from safeupdates.models import LockVersionMixin

    if not issubclass(model, LockVersionMixin) or model._meta.proxy:
        return []
    messages: list[CheckMessage] = []
    for name, holds in _VERSION_FIELDS.items():
        expected = type(LockVersionMixin._meta.get_field(name))
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:  # `lock_version = None` removes an abstract base's field
            if name not in vars(model):
                continue
            kind = "None"
        else:
            if isinstance(field, expected) or field.model is not model:
                continue
            kind = type(field).__name__
        messages.append(
            Error(
                f"{model._meta.label}.{name} ({kind}) replaces the {expected.__name__} of "
                f"LockVersionMixin: safeupdates keeps {holds} there, and its writes fail on another type.",
                hint=f"Remove {name} from {model._meta.label} and let LockVersionMixin add it (makemigrations "
                "then alters the column); a field of your own needs another name.",
                obj=model,
                id="safeupdates.E008",
            )
        )
    return messages


@register(Tags.database)
def check_pooler(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W004: a PostgreSQL database that looks pooled while ``SAFEUPDATES_PREPARED_STATEMENTS`` is unset.

    ``DISABLE_SERVER_SIDE_CURSORS`` is what Django asks for behind PgBouncer in transaction mode, where
    prepared statements work only with PgBouncer 1.22+ and ``max_prepared_statements``. Read from
    settings, no connection.
    """
    if hasattr(settings, "SAFEUPDATES_PREPARED_STATEMENTS"):
        return []
    return [
        Warning(
            f"Database {alias!r} looks pooled (DISABLE_SERVER_SIDE_CURSORS), and safeupdates runs its guarded "
            "writes as prepared statements.",
            hint="Behind PgBouncer in transaction mode prepared statements need PgBouncer >= 1.22 with "
            "max_prepared_statements > 0 (and psycopg >= 3.2): then set SAFEUPDATES_PREPARED_STATEMENTS = True. "
            "Otherwise set it to False.",
            id="safeupdates.W004",
        )
        for alias, config in settings.DATABASES.items()
        if config.get("ENGINE") == "django.db.backends.postgresql" and config.get("DISABLE_SERVER_SIDE_CURSORS")
    ]


@register(Tags.compatibility)
def check_database(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E004: the guarded write supports PostgreSQL and SQLite only (read from settings, no connection)."""
    supported = {"django.db.backends.postgresql", "django.db.backends.sqlite3"}
    return [
        Error(
            f"Database {alias!r} uses {config.get('ENGINE')!r}; safeupdates supports PostgreSQL and SQLite.",
            hint="Use PostgreSQL in production (SQLite for development).",
            id="safeupdates.E004",
        )
        for alias, config in settings.DATABASES.items()
        if config.get("ENGINE") not in supported
    ]


def _read_retry() -> Any:
    from rq import Retry

    options = conf.retry()
    return Retry(**options) if options.get("max") else None


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E005: a ``SAFEUPDATES_*`` setting has a value its reader cannot use."""
    readers: dict[str, Callable[[], Any]] = {
        "SAFEUPDATES_MAX_CLOCK_SKEW": conf.max_clock_skew,
        "SAFEUPDATES_JOB_TIMEOUT": conf.job_timeout,
        "SAFEUPDATES_RELAY_AFTER": conf.relay_after,
        "SAFEUPDATES_RETENTION": conf.retention,
        "SAFEUPDATES_TASK_RETENTION": conf.task_retention,
        "SAFEUPDATES_REDUCE_ATTEMPTS": conf.reduce_attempts,
        "SAFEUPDATES_RETRY": _read_retry,
    }
    messages: list[CheckMessage] = []
    for name, read in readers.items():
        try:
            value = read()
        except Exception as exc:
            messages.append(
                Error(
                    f"{name} is invalid: {exc}",
                    hint="See the settings table in docs/deployment.md for the expected type.",
                    id="safeupdates.E005",
                )
            )
            continue
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            messages.append(Error(f"{name} must not be negative.", id="safeupdates.E005"))
        elif name == "SAFEUPDATES_REDUCE_ATTEMPTS" and value < 1:
            messages.append(Error(f"{name} must be at least 1 (the first run counts).", id="safeupdates.E005"))
    return messages


@register(Tags.compatibility)
def check_queue_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W002: a queue named in a ``SAFEUPDATES_*_QUEUE`` setting is not in ``RQ_QUEUES``.

    ``SAFEUPDATES_QUEUE`` itself is checked by E002; this covers the others (``SAFEUPDATES_FAST_QUEUE``,
    ``SAFEUPDATES_SLOW_QUEUE`` and any later one).
    """
    queues = getattr(settings, "RQ_QUEUES", {}) or {}
    messages: list[CheckMessage] = []
    for name in sorted(dir(settings)):
        if not (name.startswith("SAFEUPDATES_") and name.endswith("_QUEUE")) or name == "SAFEUPDATES_QUEUE":
            continue
        value = getattr(settings, name)
        choices = ", ".join(sorted(queues)) or "(none configured)"
        if not isinstance(value, str):
            messages.append(
                Warning(
                    f"{name} is {value!r}, which is not the name of a queue in RQ_QUEUES.",
                    hint=f"Set {name} to one of: {choices}.",
                    id="safeupdates.W002",
                )
            )
        elif value not in queues:
            messages.append(
                Warning(
                    f"{name} is {value!r}, which is not a queue in RQ_QUEUES; jobs sent there would be refused.",
                    hint=f"Add {value!r} to RQ_QUEUES or set {name} to one of: {choices}.",
                    id="safeupdates.W002",
                )
            )
    return messages
