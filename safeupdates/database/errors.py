"""What a database error means for the job path, and which database it came from.

:func:`is_transient` sorts the errors a retry may cure (a lost connection, a lock timeout, a failover)
from those that are the statement's own and would fail again (a constraint, a value the database
refuses): the first are retried and left for the relay, the second rejected.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connections
from django.db.utils import InterfaceError, OperationalError

from safeupdates.exceptions import BackendUnavailable

#: PostgreSQL's SQLSTATE for "could not obtain lock" (NOWAIT and lock_timeout alike).
LOCK_NOT_AVAILABLE = "55P03"
#: PostgreSQL's SQLSTATE for "permission denied".
INSUFFICIENT_PRIVILEGE = "42501"

# SQLSTATE classes and codes of errors that are not about the values written: the same statement may
# succeed when it runs again, so RQ retries the job. Every other error with a SQLSTATE (a trigger's RAISE
# EXCEPTION, P0001; a constraint, 23xxx; a bad value, 22xxx; a permission, 42501 ...) is the statement's
# own and would fail again: the request that causes it is rejected.
_TRANSIENT_SQLSTATE_CLASSES = frozenset(
    {
        "08",  # connection exception; PgBouncer's own errors too (08P01: "server conn crashed?" ...)
        "40",  # transaction rollback: serialization failure 40001, deadlock 40P01, ...
        "53",  # insufficient resources: disk full, out of memory, too many connections
        "57",  # operator intervention: query canceled (statement_timeout) 57014, shutdown 57P01-57P03
        "58",  # system error (an I/O error)
        "XX",  # internal error: the server's fault, not the value's
    }
)
_TRANSIENT_SQLSTATES = frozenset(
    {
        LOCK_NOT_AVAILABLE,  # 55P03: lock_timeout or NOWAIT
        "55006",  # object in use
        "25006",  # read-only transaction: a primary that became a standby in a failover
        "25P03",  # idle_in_transaction_session_timeout
        # A pooler in transaction mode without prepared statement support (PgBouncer < 1.22) hands the next
        # transaction another server connection, where the client's prepared statement does not exist, or
        # one of the same name does: the statement did not run, and may on another connection (system
        # check E029 refuses that configuration where it can see it).
        "26000",  # invalid_sql_statement_name: prepared statement does not exist
        "42P05",  # duplicate_prepared_statement
    }
)


#: feature_not_supported: a statement's own (FOR UPDATE with an aggregate ...), but for the one that
#: PostgreSQL raises when it revalidates a prepared statement whose result type a migration changed
#: ("cached plan must not change result type", raised by its function of this name, in any language):
#: the statement did not run, and runs once prepared again, as it is after the transaction's rollback.
FEATURE_NOT_SUPPORTED = "0A000"
_REPLANNED_BY = "RevalidateCachedQuery"


def is_replanned(exc: BaseException) -> bool:
    """True if ``exc`` (a Django ``DatabaseError``) is PostgreSQL refusing a prepared statement whose
    result type changed since it was prepared (a column it returns changed type)."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) != FEATURE_NOT_SUPPORTED:
        return False
    return getattr(getattr(cause, "diag", None), "source_function", None) == _REPLANNED_BY


def is_transient(exc: BaseException) -> bool:
    """True if database error ``exc`` may not happen again when the job is retried.

    PostgreSQL says so in the error's SQLSTATE (see above). An error without one comes from the client
    library: a connection lost before the server answered (``OperationalError``, ``InterfaceError``) is
    transient; on SQLite "database is locked" is an ``OperationalError`` too, and its refusals of a value
    (a constraint, a trigger's ``RAISE(ABORT)``) are ``IntegrityError``.
    """
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        if sqlstate == FEATURE_NOT_SUPPORTED:
            return is_replanned(exc)
        return sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES or sqlstate in _TRANSIENT_SQLSTATES
    return isinstance(exc, OperationalError | InterfaceError)


def is_lock_unavailable(exc: BaseException) -> bool:
    """True if ``exc`` (a Django ``OperationalError``) says a row lock could not be had."""
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE


def is_permission_denied(exc: BaseException) -> bool:
    """True if ``exc`` (a Django ``DatabaseError``) says the user may not read or write what it named."""
    return getattr(exc.__cause__, "sqlstate", None) == INSUFFICIENT_PRIVILEGE


def describe_database(using: str) -> str:
    """``vendor NAME at HOST:PORT`` of database ``using``, for error messages (no password)."""
    connection = connections[using]
    config = connection.settings_dict
    where = f" at {config.get('HOST')}:{config.get('PORT') or 'default port'}" if config.get("HOST") else ""
    return f"{connection.display_name} {config.get('NAME')}{where}"


@contextmanager
def unreachable_database(using: str) -> Iterator[None]:
    """Raise :class:`BackendUnavailable` for a transient error of database ``using`` inside the block."""
    try:
        yield
    except DatabaseError as exc:
        if not is_transient(exc):
            raise
        config = connections[using].settings_dict
        where = f"{config.get('HOST')}:{config.get('PORT') or 'default port'}/" if config.get("HOST") else ""
        raise BackendUnavailable(connections[using].display_name, f"{where}{config.get('NAME')}", exc) from exc
