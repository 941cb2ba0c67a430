"""Django's PostgreSQL backend as the test settings use it: the same, but for how a flush empties the tables.

pytest-django flushes the test database after each transactional test (``transaction=True``, every test
with real workers, Django's ``TransactionTestCase``). Django's flush is one ``TRUNCATE`` of every table,
which makes new files for each of the ~60 tables of the test project: about 0.35 s per test, a few minutes
of a run. The tests leave a few rows, which ``DELETE`` removes in a few milliseconds. Sequences are not
reset either way (Django resets them only when asked, and then this falls back on ``TRUNCATE``).

It is also a backend built on Django's PostgreSQL one, as PostGIS's or django-tenants' are: safeupdates'
checks must take it for PostgreSQL (tests/test_checks.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.postgresql import base, creation, operations


class DatabaseOperations(operations.DatabaseOperations):
    def sql_flush(self, style: Any, tables: Any, *, reset_sequences: bool = False, allow_cascade: bool = False) -> Any:
        if not tables or reset_sequences or allow_cascade:
            return super().sql_flush(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        # Django's foreign keys are DEFERRABLE INITIALLY DEFERRED, and the flush runs in one transaction
        # (execute_sql_flush): the tables may be emptied in any order.
        return [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]


class DatabaseCreation(creation.DatabaseCreation):
    def _destroy_test_db(self, test_database_name: str, verbosity: int) -> None:
        if getattr(settings, "SAFEUPDATES_TEST_TOPOLOGY", "direct") == "direct":
            return super()._destroy_test_db(test_database_name, verbosity)
        # Behind PgBouncer (tests/pooler.py) the pooler keeps its server connections to the test
        # database open after the suite's are closed, as Django's pool keeps its idle ones: FORCE
        # ends them (PostgreSQL 13+).
        with self._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE {self.connection.ops.quote_name(test_database_name)} WITH (FORCE)")


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations
    creation_class = DatabaseCreation
