from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.checks import Error, Warning
from django.db import models
from django.test import override_settings
from django.test.utils import isolate_apps

from safeupdates.checks import check_database, check_delivery, check_models, check_settings
from safeupdates.models import SafeUpdateModel


def test_no_messages_for_a_good_configuration():
    assert check_delivery() == []
    assert check_models() == []
    assert check_database() == []
    assert check_settings() == []


@override_settings(INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "safeupdates"])
def test_e001_django_rq_not_installed():
    assert check_delivery() == [
        Error(
            "django_rq is not in INSTALLED_APPS.",
            hint="SAFEUPDATES_DELIVERY is 'rq' (the default): safeupdates delivers its jobs through django-rq. "
            "Add 'django_rq' to INSTALLED_APPS and configure RQ_QUEUES, or set SAFEUPDATES_DELIVERY to 'celery' "
            "or 'tasks' (docs/delivery.md).",
            id="safeupdates.E001",
        )
    ]


@override_settings(SAFEUPDATES_QUEUE="missing")
def test_e002_queue_not_in_rq_queues():
    assert check_delivery() == [
        Error(
            "SAFEUPDATES_QUEUE is 'missing', which is not a queue in RQ_QUEUES.",
            hint="Add 'missing' to RQ_QUEUES or set SAFEUPDATES_QUEUE to one of: default, fast, slow.",
            id="safeupdates.E002",
        )
    ]


@pytest.mark.parametrize("rq_queues", [{}, None])
def test_e002_without_any_queue_says_none_is_configured(rq_queues):
    with override_settings(RQ_QUEUES=rq_queues):
        assert check_delivery() == [
            Error(
                "SAFEUPDATES_QUEUE is 'default', which is not a queue in RQ_QUEUES.",
                hint="Add 'default' to RQ_QUEUES or set SAFEUPDATES_QUEUE to one of: (none configured).",
                id="safeupdates.E002",
            )
        ]


def test_w001_and_e003():
    with isolate_apps("tests.testapp") as apps:

        class NoFields(SafeUpdateModel):
            flag = models.BooleanField(default=False)

            class Meta:
                app_label = "testapp"

        class BadFields(SafeUpdateModel):
            flag = models.BooleanField(default=False)
            safe_update_fields = ("flag", "lock_version", "nope")

            class Meta:
                app_label = "testapp"

        messages = check_models(app_configs=[apps.get_app_config("testapp")])
        assert messages == [
            Warning(
                "testapp.NoFields has no safe_update_fields, so enqueue_update() refuses every field.",
                hint="Name the fields queued jobs may change, e.g. safe_update_fields = ('active',).",
                obj=NoFields,
                id="safeupdates.W001",
            ),
            Error(
                "testapp.BadFields.safe_update_fields names 'lock_version', which cannot be updated: "
                "testapp.BadFields.lock_version is managed by safeupdates and cannot be set by an update.",
                hint="List concrete, non-primary-key fields only.",
                obj=BadFields,
                id="safeupdates.E003",
            ),
            Error(
                "testapp.BadFields.safe_update_fields names 'nope', which cannot be updated: "
                "testapp.BadFields has no field 'nope'; fields that can be updated: flag.",
                hint="List concrete, non-primary-key fields only.",
                obj=BadFields,
                id="safeupdates.E003",
            ),
        ]


def test_e004_unsupported_database():
    databases = {"default": {"ENGINE": "django.db.backends.mysql", "NAME": "x"}}
    with override_settings(DATABASES=databases):
        assert check_database() == [
            Error(
                "Database 'default' uses 'django.db.backends.mysql'; safeupdates supports PostgreSQL and SQLite.",
                hint="Use PostgreSQL in production (SQLite for development).",
                id="safeupdates.E004",
            )
        ]


@pytest.mark.parametrize(
    ("engine", "vendor"),
    [
        ("django.db.backends.postgresql", "postgresql"),
        ("django.db.backends.sqlite3", "sqlite"),
        # Built on Django's own, as PostGIS's, SpatiaLite's or django-tenants' backends are.
        ("tests.backends.postgresql", "postgresql"),
        ("tests.backends.sqlite3", "sqlite"),
    ],
)
def test_backends_built_on_djangos_postgresql_or_sqlite_are_supported_and_checked_as_such(settings, engine, vendor):
    from safeupdates.checks import check_pooler, check_sqlite, vendor_of

    config = {"ENGINE": engine, "NAME": "x", "DISABLE_SERVER_SIDE_CURSORS": True}
    settings.DATABASES = {"default": config}
    assert vendor_of(config) == vendor
    assert check_database() == []
    # The checks of one vendor apply to a backend built on its Django backend.
    assert [m.id for m in check_pooler()] == (["safeupdates.W004"] if vendor == "postgresql" else [])
    assert [m.id for m in check_sqlite()] == (["safeupdates.W006"] if vendor == "sqlite" else [])


@pytest.mark.parametrize("engine", ["tests.no_such_backend", "django.db.backends.oracle", "", None])
def test_e004_a_backend_that_cannot_be_imported_or_named_is_unsupported(settings, engine):
    settings.DATABASES = {"default": {"ENGINE": engine, "NAME": "x"}}
    assert [m.id for m in check_database()] == ["safeupdates.E004"]


#: One value of each setting that is not valid, and the message: what the setting sets, and what a valid
#: value looks like (never Python's own text, never a page of the docs, which are not in the wheel).
E005 = {
    "SAFEUPDATES_RETRY": (
        {"max": "3"},
        "SAFEUPDATES_RETRY = {'max': '3'} is not valid. It sets how RQ retries an apply job after a transient "
        "database error: the keyword arguments of rq.Retry.",
        "Set it to a dict such as {'max': 3, 'interval': [1, 5, 15]} (the default): max is how many retries "
        "(a whole number, 0 for none), interval the seconds to wait before each (a whole number, or a list of "
        "them).",
    ),
    "SAFEUPDATES_MAX_CLOCK_SKEW": (
        "5 minutes",
        "SAFEUPDATES_MAX_CLOCK_SKEW = '5 minutes' is not valid. It sets how far in the future the client "
        "timestamp of update_if_newer(synced_at=...) may lie.",
        "Set it to a number of seconds (0 up to 1000 years) or a timedelta; the default is 300.",
    ),
    "SAFEUPDATES_JOB_TIMEOUT": (
        "soon",
        "SAFEUPDATES_JOB_TIMEOUT = 'soon' is not valid. It sets RQ's job_timeout of an apply job, and how long "
        "@idempotent waits for its lock outside a job.",
        "Set it to a whole number of seconds, 0 or more; the default is 60.",
    ),
    "SAFEUPDATES_RELAY_AFTER": (
        -5,
        "SAFEUPDATES_RELAY_AFTER = -5 is not valid. It sets how long a request may stay pending before "
        "safeupdates_relay delivers it again.",
        "Set it to a whole number of seconds, 0 up to 1000 years; the default is 30.",
    ),
    "SAFEUPDATES_RETENTION": (
        float("nan"),
        "SAFEUPDATES_RETENTION = nan is not valid. It sets how long safeupdates_purge keeps applied "
        "and stale requests.",
        "Set it to a whole number of days, 0 or more; the default is 30.",
    ),
    "SAFEUPDATES_TASK_RETENTION": (
        "a year",
        "SAFEUPDATES_TASK_RETENTION = 'a year' is not valid. It sets how long safeupdates_purge keeps the rows "
        "of completed @idempotent tasks (a deleted row lets its task run again).",
        "Set it to None, to keep them forever (the default), or a whole number of days, 0 or more.",
    ),
    "SAFEUPDATES_FAILED_RETENTION": (
        -1,
        "SAFEUPDATES_FAILED_RETENTION = -1 is not valid. It sets how long safeupdates_purge keeps failed "
        "requests (their retries ran out; they can be re-driven).",
        "Set it to a whole number of days, 0 or more, or None to keep them until they are re-driven; the "
        "default is 90.",
    ),
    "SAFEUPDATES_REJECTED_RETENTION": (
        "90",
        "SAFEUPDATES_REJECTED_RETENTION = '90' is not valid. It sets how long safeupdates_purge keeps rejected "
        "requests (refused for their values, or their row was gone; they can be re-driven).",
        "Set it to a whole number of days, 0 or more, or None to keep them until they are re-driven; the "
        "default is 90.",
    ),
    "SAFEUPDATES_REDUCE_ATTEMPTS": (
        0,
        "SAFEUPDATES_REDUCE_ATTEMPTS = 0 is not valid. It sets how many failed runs of a batch's reduce make "
        "the batch reduce_failed.",
        "Set it to a whole number, 1 or more (the first run counts); the default is 5.",
    ),
    "SAFEUPDATES_SWEEP_RECORDS": (
        "all",
        "SAFEUPDATES_SWEEP_RECORDS = 'all' is not valid. It sets how many other records an apply job may "
        "apply after its own, taking their waiting jobs off the queue.",
        "Set it to a whole number, 0 or more (0: a job applies its own record only); the default is 200.",
    ),
    "SAFEUPDATES_PREPARED_STATEMENTS": (
        "False",
        "SAFEUPDATES_PREPARED_STATEMENTS = 'False' is not valid. It sets whether guarded writes and checked "
        "saves run as prepared statements on PostgreSQL.",
        "Set it to True or False; the default is True.",
    ),
}


@pytest.mark.parametrize("name", sorted(E005))
def test_e005_says_what_the_setting_means_and_what_a_valid_value_looks_like(name):
    value, message, hint = E005[name]
    with override_settings(**{name: value}):
        assert check_settings() == [Error(message, hint=hint, id="safeupdates.E005")]


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("SAFEUPDATES_RETRY", [{"max": 2, "interval": -1}, {"max": -1}, {"tries": 3}, {"interval": 5}, [3], 3, None]),
        ("SAFEUPDATES_RETRY", [{"max": 0, "interval": "x"}, {"max": 2, "interval": 1.5}, {"max": True}]),
        ("SAFEUPDATES_MAX_CLOCK_SKEW", [-1, float("inf"), float("nan"), True, None, timedelta(seconds=-1)]),
        ("SAFEUPDATES_JOB_TIMEOUT", [-1, 1.5, "60", None, True]),
        ("SAFEUPDATES_RELAY_AFTER", [0.5, "30", None]),
        ("SAFEUPDATES_RETENTION", [-2, "soon", 1.5]),
        ("SAFEUPDATES_TASK_RETENTION", [-1, float("nan"), "90"]),
        ("SAFEUPDATES_FAILED_RETENTION", [-1, 1.5, "90", float("inf"), True, 10**9]),
        ("SAFEUPDATES_REJECTED_RETENTION", [-1, 1.5, "90", float("nan"), False, 10**9]),
        ("SAFEUPDATES_REDUCE_ATTEMPTS", [None, -1, 2.0]),
        ("SAFEUPDATES_PREPARED_STATEMENTS", [None, 0, 1, "True"]),
        ("SAFEUPDATES_SWEEP_RECORDS", [-1, 2.5, "200", None, True]),
    ],
)
def test_e005_refuses_what_the_setting_cannot_use(name, values):
    hint = E005[name][2]
    for value in values:
        with override_settings(**{name: value}):
            assert [(m.id, m.msg.split(" is not valid.")[0], m.hint) for m in check_settings()] == [
                ("safeupdates.E005", f"{name} = {value!r}", hint)
            ], value


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("SAFEUPDATES_RETRY", [{"max": 0}, {"max": 5}, {"max": 2, "interval": 3}, {"max": 3, "interval": [0, 1]}]),
        ("SAFEUPDATES_MAX_CLOCK_SKEW", [0, 2.5, timedelta(minutes=5)]),
        ("SAFEUPDATES_JOB_TIMEOUT", [0, 600]),
        ("SAFEUPDATES_TASK_RETENTION", [None, 0, 365]),
        ("SAFEUPDATES_FAILED_RETENTION", [None, 0, 7, 365_000]),
        ("SAFEUPDATES_REJECTED_RETENTION", [None, 0, 7, 365_000]),
        ("SAFEUPDATES_REDUCE_ATTEMPTS", [1, 10]),
        ("SAFEUPDATES_PREPARED_STATEMENTS", [True, False]),
        ("SAFEUPDATES_SWEEP_RECORDS", [0, 1, 5000]),
    ],
)
def test_e005_accepts_valid_values(name, values):
    for value in values:
        with override_settings(**{name: value}):
            assert check_settings() == [], value


def test_e006_and_w003_fields_named_like_keyword_arguments():
    with isolate_apps("tests.testapp") as apps:

        class Clashing(SafeUpdateModel):
            queue = models.CharField(max_length=10, default="")
            version = models.IntegerField(default=0)
            synced_at = models.DateTimeField(null=True)
            title = models.CharField(max_length=10, default="")
            safe_update_fields = ("queue", "version", "title")

            class Meta:
                app_label = "testapp"

        class Plain(models.Model):
            # Not updated through safeupdates: its names are nobody's business.
            version = models.IntegerField(default=0)
            queue = models.CharField(max_length=10, default="")

            class Meta:
                app_label = "testapp"

            def __str__(self) -> str:
                return self.queue

        messages = check_models(app_configs=[apps.get_app_config("testapp")])
        assert messages == [
            Error(
                "testapp.Clashing.safe_update_fields names 'queue', which is also a keyword argument of "
                "enqueue_update(): queue=... would be taken as that argument, never as a change of the field.",
                hint="Rename the field (db_column='queue' keeps its column) and list the new name.",
                obj=Clashing,
                id="safeupdates.E006",
            ),
            Error(
                "testapp.Clashing.safe_update_fields names 'version', which is also a keyword argument of "
                "update_if_newer(): version=... would be taken as that argument, never as a change of the field.",
                hint="Rename the field (db_column='version' keeps its column) and list the new name.",
                obj=Clashing,
                id="safeupdates.E006",
            ),
            Warning(
                "testapp.Clashing.synced_at has the name of a keyword argument of update_if_newer(), which "
                "therefore cannot change it.",
                hint="Rename the field (db_column='synced_at' keeps its column), or write it with save().",
                obj=Clashing,
                id="safeupdates.W003",
            ),
        ]


def test_e006_follows_the_signatures():
    from safeupdates.checks import reserved_change_names

    assert reserved_change_names() == {
        "obj_or_model": ("enqueue_update",),
        "pk": ("enqueue_update",),
        "queue": ("enqueue_update",),
        "request_id": ("enqueue_update", "update_if_newer"),
        "synced_at": ("update_if_newer",),
        "using": ("enqueue_update",),
        "version": ("update_if_newer",),
    }


def test_task_retention_default_keeps_tasks_forever():
    from safeupdates import conf

    assert conf.task_retention() is None
    with override_settings(SAFEUPDATES_TASK_RETENTION=90):
        assert conf.task_retention() == 90


def test_e007_a_composite_primary_key_is_refused():
    from safeupdates.models import LockVersionMixin

    with isolate_apps("tests.testapp") as apps:

        class Membership(LockVersionMixin):
            pk = models.CompositePrimaryKey("team", "member")
            team = models.IntegerField()
            member = models.IntegerField()

            class Meta:
                app_label = "testapp"

        assert [
            m for m in check_models(app_configs=[apps.get_app_config("testapp")]) if m.id == "safeupdates.E007"
        ] == [
            Error(
                "testapp.Membership has a composite primary key, which safeupdates does not support: its "
                "guarded writes, request log and jobs address a row by one key.",
                hint="Give the model a single-column primary key (keep the pair unique with a UniqueConstraint).",
                obj=Membership,
                id="safeupdates.E007",
            )
        ]


@pytest.mark.parametrize(
    ("options", "explicit", "warned"),
    [
        ({"DISABLE_SERVER_SIDE_CURSORS": True}, None, True),
        ({"DISABLE_SERVER_SIDE_CURSORS": True}, True, False),
        ({"DISABLE_SERVER_SIDE_CURSORS": True}, False, False),
        ({}, None, False),
    ],
)
def test_w004_a_pooled_database_without_an_explicit_prepared_statements_setting(settings, options, explicit, warned):
    from safeupdates.checks import check_pooler

    settings.DATABASES = {
        "default": {**settings.DATABASES["default"], "ENGINE": "django.db.backends.postgresql", **options}
    }
    if explicit is not None:
        settings.SAFEUPDATES_PREPARED_STATEMENTS = explicit
    expected = [
        Warning(
            "Database 'default' looks pooled (DISABLE_SERVER_SIDE_CURSORS), and safeupdates runs its guarded "
            "writes as prepared statements.",
            hint="Behind PgBouncer in transaction mode prepared statements need PgBouncer >= 1.22 with "
            "max_prepared_statements > 0 (and psycopg >= 3.2): then set SAFEUPDATES_PREPARED_STATEMENTS = True. "
            "Otherwise set it to False.",
            id="safeupdates.W004",
        )
    ]
    assert check_pooler() == (expected if warned else [])


@pytest.mark.parametrize(
    ("name", "field", "kind", "expected"),
    [
        ("lock_version", models.CharField(max_length=20, default="0"), "CharField", "BigIntegerField"),
        ("lock_version", models.IntegerField(default=0), "IntegerField", "BigIntegerField"),
        ("field_versions", models.CharField(max_length=200, default="{}"), "CharField", "JSONField"),
        ("field_versions", models.TextField(default="{}"), "TextField", "JSONField"),
        ("field_versions", None, "None", "JSONField"),  # Django's way to remove a field of an abstract base
    ],
)
def test_e008_a_model_field_replaces_a_version_field_of_the_mixin(name, field, kind, expected):
    """A django-concurrency or Rails habit: the model declares its own ``lock_version``. Django lets it
    replace the mixin's, and the guarded write would fail later with ``operator does not exist``."""
    from safeupdates.models import LockVersionMixin

    holds = {
        "lock_version": "the row's version (a 64-bit integer from the version source)",
        "field_versions": "the version of each field's last write (a JSON object)",
    }[name]
    with isolate_apps("tests.testapp") as apps:
        attrs = {"__module__": __name__, name: field, "Meta": type("Meta", (), {"app_label": "testapp"})}
        Legacy = type("Legacy", (LockVersionMixin,), attrs)
        Child = type("Child", (Legacy,), {"__module__": __name__, "Meta": type("Meta", (), {"app_label": "testapp"})})
        messages = check_models(app_configs=[apps.get_app_config("testapp")])
    if field is not None:
        assert Child._meta.get_field(name).model is Legacy  # reported once, on the model that declares it
    assert messages == [
        Error(
            f"testapp.Legacy.{name} ({kind}) replaces the {expected} of LockVersionMixin: safeupdates keeps "
            f"{holds} there, and its writes fail on another type.",
            hint=f"Remove {name} from testapp.Legacy and let LockVersionMixin add it (makemigrations then alters "
            "the column); a field of your own needs another name.",
            obj=Legacy,
            id="safeupdates.E008",
        )
    ]


def test_e008_a_subclass_of_the_mixins_field_type_is_accepted():
    from safeupdates.models import LockVersionMixin

    with isolate_apps("tests.testapp") as apps:

        class Wider(LockVersionMixin):
            lock_version = models.PositiveBigIntegerField(default=0, editable=False)
            field_versions = models.JSONField(default=dict, editable=False, blank=True)

            class Meta:
                app_label = "testapp"

        assert check_models(app_configs=[apps.get_app_config("testapp")]) == []


SQLITE = "django.db.backends.sqlite3"


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ({}, True),
        ({"transaction_mode": "DEFERRED"}, True),
        ({"timeout": 20}, True),
        ({"transaction_mode": "IMMEDIATE", "timeout": 20}, False),
        ({"transaction_mode": "immediate"}, False),
        ({"transaction_mode": "EXCLUSIVE"}, False),  # takes the write lock at BEGIN too
    ],
)
def test_w006_a_sqlite_database_without_immediate_transactions(settings, options, warned):
    from safeupdates.checks import check_sqlite

    settings.DATABASES = {
        "default": {"ENGINE": SQLITE, "NAME": "dev.sqlite3", "OPTIONS": options},
        "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"},
    }
    expected = [
        Warning(
            "Database 'default' is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE': a worker that writes "
            "while another process writes fails with 'database is locked'.",
            hint='Add "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20} to it, as in the quick start: a '
            "transaction then takes SQLite's write lock when it begins, and waits up to 20 s for it.",
            id="safeupdates.W006",
        )
    ]
    assert check_sqlite() == (expected if warned else [])


@pytest.mark.parametrize(("autocommit", "warned"), [(False, True), (True, False), (None, False)])
def test_w007_a_database_without_autocommit(settings, autocommit, warned):
    """With ``AUTOCOMMIT`` False every connection is managed by hand: jobs and outcome signals wait for
    autocommit to be turned on after a commit, which such a project never does."""
    from safeupdates.checks import check_autocommit

    config = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}
    settings.DATABASES = {"default": {"ENGINE": SQLITE, "NAME": "dev.sqlite3"}, "manual": config}
    if autocommit is not None:
        config["AUTOCOMMIT"] = autocommit
    expected = [
        Warning(
            "Database 'manual' has AUTOCOMMIT = False: safeupdates enqueues a request's job, and sends its "
            "outcome signal, when autocommit is turned on again after the commit (as Django runs on_commit() "
            "callbacks), so jobs wait for the relay and no outcome signal is sent.",
            hint="Leave AUTOCOMMIT on and use transaction.atomic() (or ATOMIC_REQUESTS) for transactions.",
            id="safeupdates.W007",
        )
    ]
    assert check_autocommit() == (expected if warned else [])


@pytest.mark.parametrize(("version", "refused"), [((3, 31, 1), True), ((3, 34, 1), True), ((3, 35, 0), False)])
def test_e014_sqlite_older_than_3_35_has_no_returning(settings, version, refused):
    """Django 5.2 accepts SQLite 3.31, but the checked save and the guarded writes read their versions back
    with RETURNING (SQLite 3.35): an older library fails every such write with a syntax error."""
    from safeupdates.checks import sqlite_version_errors

    settings.DATABASES = {
        "default": {"ENGINE": SQLITE, "NAME": "dev.sqlite3"},
        "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"},
    }
    found = ".".join(map(str, version))
    expected = [
        Error(
            f"Database 'default' is SQLite {found}; safeupdates needs SQLite 3.35 or later (RETURNING), else every "
            "checked save and guarded write fails with a syntax error.",
            hint="Use a Python linked with a newer SQLite (python -c 'import sqlite3; print(sqlite3.sqlite_version)' "
            "prints it), or PostgreSQL.",
            id="safeupdates.E014",
        )
    ]
    assert sqlite_version_errors(version) == (expected if refused else [])


def test_e014_the_sqlite_this_python_links_is_new_enough(settings):
    import sqlite3

    from safeupdates.checks import check_sqlite_version

    settings.DATABASES = {"default": {"ENGINE": SQLITE, "NAME": "dev.sqlite3"}}
    assert sqlite3.sqlite_version_info >= (3, 35, 0)
    assert check_sqlite_version() == []


@pytest.mark.django_db  # run_checks() runs every check, some of Django's ask the database for its version
def test_w005_check_deploy_warns_that_sqlite_is_for_development(settings):
    from django.core.checks import run_checks

    settings.DATABASES = {
        "default": {"ENGINE": SQLITE, "NAME": "dev.sqlite3", "OPTIONS": {"transaction_mode": "IMMEDIATE"}}
    }
    deploy = [m for m in run_checks(include_deployment_checks=True) if m.id.startswith("safeupdates.")]
    assert deploy == [
        Warning(
            "The default database is SQLite, which safeupdates supports for development only: it has no row "
            "locks, and every write locks the whole database.",
            hint="Use PostgreSQL in production (the extra [postgres] installs psycopg 3). For development, keep "
            'SQLite\'s OPTIONS {"transaction_mode": "IMMEDIATE", "timeout": 20} (the quick start\'s).',
            id="safeupdates.W005",
        )
    ]
    assert [m for m in run_checks() if m.id.startswith("safeupdates.")] == []  # development: no W005
    settings.DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}}
    assert [m for m in run_checks(include_deployment_checks=True) if m.id.startswith("safeupdates.")] == []


@pytest.mark.django_db
def test_the_database_settings_checks_run_in_a_plain_check(settings):
    """W004, W006 and W007 read settings only, so they must not be tagged ``database``: Django 6.1 runs such
    checks only with ``check --database``."""
    from django.core.checks import run_checks

    settings.DATABASES = {
        "default": {"ENGINE": SQLITE, "NAME": "dev.sqlite3"},
        "pooled": {"ENGINE": "django.db.backends.postgresql", "NAME": "x", "DISABLE_SERVER_SIDE_CURSORS": True},
    }
    assert sorted(m.id for m in run_checks() if m.id.startswith("safeupdates.")) == [
        "safeupdates.W004",
        "safeupdates.W006",
    ]
    settings.DATABASES = {"default": {"ENGINE": SQLITE, "NAME": "dev.sqlite3", "AUTOCOMMIT": False}}
    assert "safeupdates.W007" in [m.id for m in run_checks()]


@pytest.fixture
def through_pgbouncer(postgres_only, monkeypatch):
    """Point the default database's settings at a PgBouncer of the test's own (tests/pooler.py), in the
    pool mode the test passes; the suite's own connection stays where it was."""
    from django.db import connections

    from tests.pooler import PgBouncer, ensure_built, ensure_installed

    started: list[PgBouncer] = []

    def through(pool_mode: str, max_prepared_statements: int = 0) -> PgBouncer:
        try:
            ensure_built() if max_prepared_statements else ensure_installed()
        except (RuntimeError, OSError) as exc:
            pytest.skip(str(exc))
        pooler = PgBouncer(pool_mode, max_prepared_statements=max_prepared_statements).start()
        started.append(pooler)
        config = connections["default"].settings_dict
        monkeypatch.setitem(config, "HOST", "127.0.0.1")
        monkeypatch.setitem(config, "PORT", str(pooler.port))
        return pooler

    yield through
    monkeypatch.undo()
    for pooler in started:
        pooler.destroy()


@pytest.mark.django_db
def test_e026_prepared_statements_behind_pgbouncer_in_transaction_mode_are_refused(through_pgbouncer, settings):
    """PgBouncer 1.18 in transaction mode hands a server connection, with the prepared statements one
    client made there, to the next client: the database check sees it and refuses the configuration
    unless SAFEUPDATES_PREPARED_STATEMENTS = False (what docs/deployment.md asks for there)."""
    from django.core.checks import run_checks

    from safeupdates.checks import check_prepared_behind_pooler

    assert check_prepared_behind_pooler(databases=["default"]) == []  # direct
    through_pgbouncer("transaction")
    assert [m.id for m in check_prepared_behind_pooler(databases=["default"])] == ["safeupdates.E029"]
    # A database check: `migrate` and `check --database` run it, a plain `check` does not connect.
    assert "safeupdates.E029" in [m.id for m in run_checks(databases=["default"])]
    assert "safeupdates.E029" not in [m.id for m in run_checks()]
    settings.SAFEUPDATES_PREPARED_STATEMENTS = False
    assert check_prepared_behind_pooler(databases=["default"]) == []


@pytest.mark.django_db
def test_e026_session_mode_keeps_prepared_statements_to_their_client(through_pgbouncer):
    from safeupdates.checks import check_prepared_behind_pooler

    through_pgbouncer("session")
    assert check_prepared_behind_pooler(databases=["default"]) == []


@pytest.mark.django_db
@pytest.mark.parametrize(("max_prepared_statements", "refused"), [(200, []), (0, ["safeupdates.E029"])])
def test_e029_pgbouncer_122_keeps_prepared_statements_to_their_client(
    through_pgbouncer, max_prepared_statements, refused
):
    """PgBouncer 1.22+ in transaction mode with max_prepared_statements (1.24, tests/pooler.py builds it)
    keeps each client's prepared statements to it: the configuration docs/deployment.md asks for there
    passes the check. The same PgBouncer without max_prepared_statements shares them, as 1.18 does."""
    from safeupdates.checks import check_prepared_behind_pooler

    through_pgbouncer("transaction", max_prepared_statements)
    assert [m.id for m in check_prepared_behind_pooler(databases=["default"])] == refused


@pytest.mark.django_db
def test_what_e026_refuses_happens_behind_pgbouncer_in_transaction_mode(postgres_only):
    """Why E029 is an error: PgBouncer 1.18 in transaction mode with one server connection, two clients
    that prepare as psycopg does (statements named _pg3_0, _pg3_1 ... per client). The second finds the
    first's statement already there (42P05), which safeupdates counts as transient: retried, not
    rejected. (Had the second client's name been free and the first's statement been the same shape,
    the second would have run the first's statement: nothing would have been raised at all.)"""
    import psycopg
    from django.db import DatabaseError
    from django.db import connection as django_connection

    from safeupdates.database.errors import is_transient
    from tests.pooler import PgBouncer, ensure_installed

    try:
        ensure_installed()
    except (RuntimeError, OSError) as exc:
        pytest.skip(str(exc))
    single = PgBouncer("transaction", pool_size=1).start()
    try:
        url = f"postgres://postgres@127.0.0.1:{single.port}/{django_connection.settings_dict['NAME']}"
        with psycopg.connect(url, autocommit=True) as first, psycopg.connect(url, autocommit=True) as second:
            first.execute("SELECT 1", prepare=True)
            with pytest.raises(psycopg.Error) as raised:
                second.execute("SELECT 2", prepare=True)
        assert raised.value.sqlstate == "42P05"
        wrapped = DatabaseError(str(raised.value))
        wrapped.__cause__ = raised.value
        assert is_transient(wrapped)
    finally:
        single.destroy()


class TestW008WorkerClass:
    """W008 is registered and runs on RQ delivery only (which classes it reports: tests/test_rq_worker.py)."""

    def test_the_suite_s_settings_name_the_warm_worker(self):
        assert check_delivery() == []

    def test_rq_s_own_forking_worker_is_reported(self):
        with override_settings(RQ={}):
            [warning] = check_delivery()
        assert isinstance(warning, Warning) and warning.id == "safeupdates.W008"
        assert "RQ's worker class rq.Worker runs every apply job in a new work horse" in warning.msg

    def test_not_on_another_delivery(self):
        with override_settings(RQ={}, SAFEUPDATES_DELIVERY="tasks"):
            assert check_delivery() == []


# -- the delivery a project configures but does not choose (issue 54) -------------------------------------

W025_HINT = (
    'Set SAFEUPDATES_DELIVERY = "{chosen}" to deliver apply jobs through it (docs/delivery.md), or '
    'SAFEUPDATES_DELIVERY = "rq" to keep RQ and silence this warning.'
)


def unset_deliveries(settings):
    """The suite's settings without SAFEUPDATES_DELIVERY, TASKS and the CELERY_* settings."""
    from django.conf import settings as current  # pytest-django's wrapper lists no settings

    for name in [name for name in dir(current) if name.startswith("CELERY_")]:
        delattr(settings, name)
    del settings.SAFEUPDATES_DELIVERY
    # Empty, not deleted: django-tasks resets its backends when TASKS changes, and a deleted setting's
    # restore left them as the test had set them (the next tests found no backend "db").
    settings.TASKS = {}


@pytest.mark.parametrize(
    "configured, chosen, what",
    [
        ({"CELERY_BROKER_URL": "amqp://guest@localhost//"}, "celery", "Celery (CELERY_BROKER_URL)"),
        ({"TASKS": {"default": {"BACKEND": "x"}}}, "tasks", "Django's Tasks framework (TASKS)"),
    ],
)
def test_w025_a_project_on_celery_or_tasks_that_leaves_the_delivery_unset(settings, configured, chosen, what):
    """The default (RQ) would send apply jobs to a Redis nothing reads: say which setting chooses."""
    from safeupdates.checks import check_delivery_chosen

    unset_deliveries(settings)
    for name, value in configured.items():
        setattr(settings, name, value)
    assert check_delivery_chosen() == [
        Warning(
            f"This project configures {what} but leaves SAFEUPDATES_DELIVERY unset, so safeupdates delivers its "
            "apply jobs through RQ (django-rq), the default.",
            hint=W025_HINT.format(chosen=chosen),
            id="safeupdates.W025",
        )
    ]
    settings.SAFEUPDATES_DELIVERY = "rq"  # chosen on purpose: nothing to say
    assert check_delivery_chosen() == []


def test_w025_is_silent_for_a_project_on_rq_alone(settings):
    from safeupdates.checks import check_delivery_chosen

    unset_deliveries(settings)
    assert check_delivery_chosen() == []


def test_a_project_without_safeupdates_in_installed_apps_is_told_so(tmp_path):
    """A model of the project imports ``safeupdates.models``: instead of Django's RuntimeError about
    ProcessedRequest's app_label, every command says what to add."""
    from tests.projects import Project, last_line

    project = Project(tmp_path, ["django.contrib.contenttypes", "django.contrib.auth", "django_rq", "shop"])
    project.app(
        "shop",
        models="""
        from django.db import models
        from safeupdates.models import SafeUpdateModel

        class Item(SafeUpdateModel):
            name = models.CharField(max_length=20)
            safe_update_fields = ("name",)
        """,
    )
    ran = project.manage("check")
    assert ran.returncode == 1
    assert last_line(ran.stderr) == (
        "django.core.exceptions.ImproperlyConfigured: 'safeupdates' is not in INSTALLED_APPS, but "
        "safeupdates.models is imported (by a model of the project, or an import of safeupdates'). Add "
        "'safeupdates' to INSTALLED_APPS, after 'django.contrib.contenttypes'."
    )
