"""A backend built on Django's SQLite one, as SpatiaLite's is: safeupdates' checks must take it for SQLite
(tests/test_checks.py)."""

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    pass
