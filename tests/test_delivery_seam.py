"""A delivery backend is one module and one line: its :class:`~safeupdates.delivery.Backend` subclass, which
holds its system checks and its start-up, and its entry in :data:`~safeupdates.delivery.BACKENDS`. Nothing
else of the package (the checks, the app's start-up, contrib's W021) names the deliveries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.checks import CheckMessage, Warning
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from safeupdates import checks, delivery
from safeupdates.contrib import check_tools_need_rq


class Quiet(delivery.Backend):
    """A delivery backend of this test's own: this class and its line in BACKENDS are all it needs."""

    task_functions = "quiet task functions"
    started = 0

    def check(self) -> list[CheckMessage]:
        return [Warning("The quiet delivery delivers nothing.", id="tests.W001")]

    def ready(self) -> None:
        type(self).started += 1


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The quiet backend registered as a project's new backend would be: one line in BACKENDS."""
    monkeypatch.setitem(delivery.BACKENDS, "quiet", delivery.Registered(f"{__name__}.Quiet", "a test's own"))
    monkeypatch.setattr(delivery, "_loaded", {})
    monkeypatch.setattr(Quiet, "started", 0)
    with override_settings(SAFEUPDATES_DELIVERY="quiet"):
        yield


def test_a_new_backend_s_own_check_runs(quiet: None) -> None:
    assert checks.check_delivery() == [Warning("The quiet delivery delivers nothing.", id="tests.W001")]


def test_a_new_backend_starts_up(quiet: None) -> None:
    delivery.ready()  # what safeupdates' AppConfig.ready() runs
    assert Quiet.started == 1
    assert isinstance(delivery.backend(), Quiet)
    assert delivery.backend().name == "quiet"


def test_the_checks_of_the_package_name_a_new_backend(quiet: None) -> None:
    """E020 offers it, and W021 (contrib's job tools need RQ) speaks of it, with no edit of theirs."""
    with override_settings(SAFEUPDATES_DELIVERY="sqs"):
        [error] = checks.check_delivery()
    assert error.id == "safeupdates.E020"
    assert error.hint.endswith(
        """"celery" (the project's Celery app, SAFEUPDATES_CELERY_APP) or "quiet" (a test's own)."""
    )
    [warning] = check_tools_need_rq()
    assert warning.id == "safeupdates.W021"
    assert warning.msg.startswith('SAFEUPDATES_DELIVERY is "quiet", but ')
    assert warning.hint.endswith("@idempotent works on quiet task functions.")


def test_a_delivery_the_settings_name_wrongly_is_not_started() -> None:
    """E020 reports it; the start-up leaves it alone, and asking for it says what is wrong."""
    with override_settings(SAFEUPDATES_DELIVERY="sqs"):
        delivery.ready()
        with pytest.raises(
            ImproperlyConfigured, match=r"SAFEUPDATES_DELIVERY = 'sqs' is not one of 'rq', 'tasks', 'celery'"
        ):
            delivery.backend()
