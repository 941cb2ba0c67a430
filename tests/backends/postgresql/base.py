"""A backend built on Django's PostgreSQL one, as PostGIS's or django-tenants' are: safeupdates' checks
must take it for PostgreSQL (tests/test_checks.py)."""

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    pass
