"""Settings are read at call time: a change through ``override_settings``, pytest-django's ``settings``
or plain assignment (set or deleted) is seen by the next call."""

from __future__ import annotations

from datetime import timedelta

from django.test import override_settings

from safeupdates import conf


def test_a_setting_changed_set_or_deleted_is_read_again(settings):
    assert conf.queue_name() == conf.QUEUE.default
    settings.SAFEUPDATES_QUEUE = "elsewhere"
    assert conf.queue_name() == "elsewhere"
    settings.SAFEUPDATES_QUEUE = "again"
    assert conf.queue_name() == "again"
    del settings.SAFEUPDATES_QUEUE
    assert conf.queue_name() == conf.QUEUE.default


def test_override_settings_is_seen_inside_and_undone_after():
    before = conf.max_clock_skew()
    with override_settings(SAFEUPDATES_MAX_CLOCK_SKEW=7):
        assert conf.max_clock_skew() == timedelta(seconds=7)
        with override_settings(SAFEUPDATES_MAX_CLOCK_SKEW=timedelta(minutes=1)):
            assert conf.max_clock_skew() == timedelta(minutes=1)
        assert conf.max_clock_skew() == timedelta(seconds=7)
    assert conf.max_clock_skew() == before


def test_a_setting_assigned_or_deleted_at_run_time_is_read_again():
    """Assigned to django.conf.settings directly (no override_settings), then deleted: each is seen."""
    from django.conf import settings as django_settings

    assert conf.job_timeout() == conf.JOB_TIMEOUT.default
    django_settings.SAFEUPDATES_JOB_TIMEOUT = 5
    try:
        assert conf.job_timeout() == 5
    finally:
        del django_settings.SAFEUPDATES_JOB_TIMEOUT
    assert conf.job_timeout() == conf.JOB_TIMEOUT.default
