"""System checks of safeupdates (``safeupdates.E001`` ...), run by ``manage.py check``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db.utils import load_backend
from django.utils.module_loading import import_string

from safeupdates import conf, delivery


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
    from safeupdates.write.validation import MANAGED_FIELDS

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
    from safeupdates.write.validation import writable_field

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


@register(Tags.compatibility)
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
        if vendor_of(config) == "postgresql" and config.get("DISABLE_SERVER_SIDE_CURSORS")
    ]


@register(Tags.database)
def check_prepared_behind_pooler(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E029: prepared statements are on, and a PostgreSQL database is reached through a pooler that lets
    one client run the prepared statements of another (PgBouncer in transaction mode before 1.22, or
    without ``max_prepared_statements``): a guarded write could run another client's statement, or fail.

    A probe (:func:`~safeupdates.database.internals.shares_prepared_statements`: a statement prepared on
    one new connection, run from a second), so a database check: ``migrate`` and ``check --database``
    run it. A probe that cannot tell (another client took the server connection in between) finds
    nothing; W004 still reads the settings.
    """
    if not databases or not conf.prepared_statements():
        return []
    from django.db import connections

    from safeupdates.database.internals import shares_prepared_statements

    return [
        Error(
            f"Database {alias!r} is reached through a pooler that lets one client run another's prepared "
            "statements (PgBouncer in transaction mode before 1.22 or without max_prepared_statements), and "
            "safeupdates runs its guarded writes as prepared statements.",
            hint="Set SAFEUPDATES_PREPARED_STATEMENTS = False, or run PgBouncer >= 1.22 with "
            "max_prepared_statements > 0, or in session mode.",
            id="safeupdates.E029",
        )
        for alias in databases
        if alias in settings.DATABASES
        and vendor_of(settings.DATABASES[alias]) == "postgresql"
        and shares_prepared_statements(connections[alias])
    ]


_DJANGOS_OWN = {"django.db.backends.postgresql": "postgresql", "django.db.backends.sqlite3": "sqlite"}


def vendor_of(config: Mapping[str, Any]) -> str | None:
    """The vendor of a database's backend (``"postgresql"``, ``"sqlite"`` ...), as its ``ENGINE``'s
    ``DatabaseWrapper`` says: a backend built on Django's PostgreSQL or SQLite one (PostGIS, SpatiaLite,
    django-tenants', a wrapper that adds metrics) is what it is built on. The backend is imported, never
    connected to. If it cannot be imported (psycopg missing, say), Django's own two are still named by
    their ``ENGINE``, and any other is None."""
    engine = config.get("ENGINE")
    if not isinstance(engine, str) or not engine:
        return None
    try:
        wrapper = load_backend(engine).DatabaseWrapper
    except (ImportError, ImproperlyConfigured, AttributeError):
        return _DJANGOS_OWN.get(engine)
    vendor = getattr(wrapper, "vendor", None)
    return vendor if isinstance(vendor, str) else None


@register(Tags.compatibility)
def check_database(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E004: the guarded write supports PostgreSQL and SQLite only, and backends built on Django's (read
    from settings, no connection)."""
    return [
        Error(
            f"Database {alias!r} uses {config.get('ENGINE')!r}; safeupdates supports PostgreSQL and SQLite.",
            hint="Use PostgreSQL in production (SQLite for development).",
            id="safeupdates.E004",
        )
        for alias, config in settings.DATABASES.items()
        if vendor_of(config) not in {"postgresql", "sqlite"}
    ]


@register(Tags.compatibility)
def check_autocommit(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W007: a database with ``AUTOCOMMIT`` False, where every connection is managed by hand. Django runs
    the ``on_commit()`` callbacks of such a transaction only when autocommit is turned on after the commit
    (:func:`safeupdates.database.transactions.after_commit`), so a project that never does runs none. Read
    from settings."""
    return [
        Warning(
            f"Database {alias!r} has AUTOCOMMIT = False: safeupdates enqueues a request's job, and sends its "
            "outcome signal, when autocommit is turned on again after the commit (as Django runs on_commit() "
            "callbacks), so jobs wait for the relay and no outcome signal is sent.",
            hint="Leave AUTOCOMMIT on and use transaction.atomic() (or ATOMIC_REQUESTS) for transactions.",
            id="safeupdates.W007",
        )
        for alias, config in settings.DATABASES.items()
        if config.get("AUTOCOMMIT", True) is False
    ]


_QUICK_START_SQLITE = '{"transaction_mode": "IMMEDIATE", "timeout": 20}'


@register(Tags.compatibility)
def check_sqlite(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W006: a SQLite database without ``transaction_mode`` IMMEDIATE (or EXCLUSIVE). SQLite's default
    deferred transactions take the write lock at the first write, and a second writer then fails at once
    with "database is locked" instead of waiting for ``timeout``. Read from settings, no connection."""
    return [
        Warning(
            f"Database {alias!r} is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE': a worker that "
            "writes while another process writes fails with 'database is locked'.",
            hint=f'Add "OPTIONS": {_QUICK_START_SQLITE} to it, as in the quick start: a transaction then takes '
            "SQLite's write lock when it begins, and waits up to 20 s for it.",
            id="safeupdates.W006",
        )
        for alias, config in settings.DATABASES.items()
        if vendor_of(config) == "sqlite"
        and str((config.get("OPTIONS") or {}).get("transaction_mode", "")).upper() not in {"IMMEDIATE", "EXCLUSIVE"}
    ]


#: The oldest SQLite whose UPDATE, INSERT and DELETE take a RETURNING clause: the checked save and the
#: guarded writes read their versions back in the statement that writes them.
SQLITE_MINIMUM = (3, 35, 0)


@register(Tags.compatibility)
def check_sqlite_version(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E014: a SQLite database, and the SQLite library Python links is older than 3.35 (no RETURNING).
    Django 5.2 accepts SQLite 3.31. Read from the library, no connection."""
    import sqlite3

    return sqlite_version_errors(sqlite3.sqlite_version_info)


def sqlite_version_errors(version: tuple[int, ...]) -> list[CheckMessage]:
    """E014 for every SQLite database in settings if ``version`` is older than :data:`SQLITE_MINIMUM`."""
    if tuple(version) >= SQLITE_MINIMUM:
        return []
    found = ".".join(map(str, version))
    return [
        Error(
            f"Database {alias!r} is SQLite {found}; safeupdates needs SQLite 3.35 or later (RETURNING), "
            "else every checked save and guarded write fails with a syntax error.",
            hint="Use a Python linked with a newer SQLite (python -c 'import sqlite3; print(sqlite3.sqlite_version)'"
            " prints it), or PostgreSQL.",
            id="safeupdates.E014",
        )
        for alias, config in settings.DATABASES.items()
        if vendor_of(config) == "sqlite"
    ]


@register(Tags.compatibility, deploy=True)
def check_sqlite_deploy(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W005 (``check --deploy``): the default database is SQLite, which is for development."""
    if vendor_of(settings.DATABASES.get("default", {})) != "sqlite":
        return []
    return [
        Warning(
            "The default database is SQLite, which safeupdates supports for development only: it has no row "
            "locks, and every write locks the whole database.",
            hint="Use PostgreSQL in production (the extra [postgres] installs psycopg 3). For development, keep "
            f"SQLite's OPTIONS {_QUICK_START_SQLITE} (the quick start's).",
            id="safeupdates.W005",
        )
    ]


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E005: a ``SAFEUPDATES_*`` setting has a value that is not valid (:data:`safeupdates.conf.SETTINGS`;
    queues: E002 and W002). The message says what the setting means and what a valid value looks like: the
    docs are not in the wheel, and the reader's own exception speaks of Python's internals."""
    messages: list[CheckMessage] = []
    for setting in conf.SETTINGS:
        if setting.accepts is None or not hasattr(settings, setting.name):
            continue  # validated by another check, or the default
        value = getattr(settings, setting.name)
        accepts = import_string(setting.accepts) if isinstance(setting.accepts, str) else setting.accepts
        if not accepts(value):
            messages.append(
                Error(
                    f"{setting.name} = {value!r} is not valid. It sets {setting.meaning}.",
                    hint=f"Set it to {setting.valid.format(default=setting.default)}.",
                    id="safeupdates.E005",
                )
            )
    return messages


@register(Tags.compatibility)
def check_delivery(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """The delivery's checks (:func:`safeupdates.delivery.check`): E020, ``SAFEUPDATES_DELIVERY`` names no
    backend; its library cannot be imported (E021, E025); else the backend's own
    (:meth:`safeupdates.delivery.Backend.check`). (W021, job tools that need RQ: in :mod:`safeupdates.contrib`.)"""
    return delivery.check()


@register(Tags.compatibility)
def check_delivery_chosen(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W025: ``SAFEUPDATES_DELIVERY`` is unset (RQ, the default) in a project that configures Celery (a
    ``CELERY_*`` setting, as Celery's Django guide names them) or Django's Tasks framework (``TASKS``): its
    apply jobs would go to a Redis that nothing of the project reads."""
    if hasattr(settings, conf.DELIVERY.name):
        return []
    celery = sorted(name for name in dir(settings) if name.startswith("CELERY_"))
    if celery:
        named = "CELERY_BROKER_URL" if "CELERY_BROKER_URL" in celery else celery[0]
        what, chosen = f"Celery ({named})", "celery"
    elif settings.is_overridden("TASKS") and getattr(settings, "TASKS", None):  # type: ignore[misc,unused-ignore]
        # The project's own TASKS: Django 6.0+ has a default one (an ImmediateBackend) in every project.
        what, chosen = "Django's Tasks framework (TASKS)", "tasks"
    else:
        return []
    return [
        Warning(
            f"This project configures {what} but leaves SAFEUPDATES_DELIVERY unset, so safeupdates delivers its "
            "apply jobs through RQ (django-rq), the default.",
            hint=f'Set SAFEUPDATES_DELIVERY = "{chosen}" to deliver apply jobs through it (docs/delivery.md), or '
            'SAFEUPDATES_DELIVERY = "rq" to keep RQ and silence this warning.',
            id="safeupdates.W025",
        )
    ]
