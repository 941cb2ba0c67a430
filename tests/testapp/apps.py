import os

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if os.environ.get("SAFEUPDATES_TEST_SIGNALS"):  # workers of tests/test_signals.py
            from tests.testapp import signals

            signals.connect()
