"""Issue 20 item 5: a Redis outage while requests are saved costs one WARNING line per request (no
traceback) and a rate-limited summary; the first delivery after it says Redis is back."""

from __future__ import annotations

import logging
import time

import pytest
from django.test import override_settings

from safeupdates import enqueue_update
from safeupdates.delivery import rq as queues
from safeupdates.jobs import relay_pending
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory
from tests.servers import OwnRedis


@pytest.fixture
def own_redis():
    server = OwnRedis().start()
    yield server
    server.destroy()


@pytest.mark.django_db(transaction=True)
def test_an_outage_logs_one_line_per_request_and_a_summary(own_redis, caplog, monkeypatch):
    monkeypatch.setattr(queues, "OUTAGE_SUMMARY_EVERY", 0.5)
    monkeypatch.setattr(queues, "_outage", queues._Outage())
    where = f"redis://127.0.0.1:{own_redis.port}/0"
    profile = ProfileFactory()
    with override_settings(RQ_QUEUES={"default": {"URL": own_redis.url}}), caplog.at_level(logging.INFO):
        enqueue_update(profile, active=True)  # Redis is up: nothing to say
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        own_redis.stop()
        down_at = time.monotonic()
        during = [enqueue_update(profile, active=value) for value in (False, True)]
        time.sleep(0.6)
        during.append(enqueue_update(profile, newsletter=True))  # now a summary is due
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage().split(" (", 1)[0] for r in lines[:3]] == [
            f"safeupdates: request {request.request_id}" for request in during
        ]
        for record, request in zip(lines, during, strict=False):
            message = record.getMessage()
            assert f"(testapp.Profile pk={profile.pk}) is saved, but Redis at {where} is unreachable" in message
            assert message.endswith("the relay will deliver it.")
            # and why (the mutant that logged None instead survived)
            assert f"is unreachable (Error 111 connecting to 127.0.0.1:{own_redis.port}." in message
            assert record.levelno == logging.WARNING and record.exc_info is None
            assert record.request_id == str(request.request_id)
        summary = lines[3].getMessage()
        assert summary.startswith(f"safeupdates: Redis at {where} has been unreachable for ")
        assert summary.endswith(": 3 request(s) saved and left for the relay (safeupdates_relay) meanwhile.")
        lasted = float(summary.split(" unreachable for ", 1)[1].split(" s:", 1)[0])
        assert 0 <= lasted <= time.monotonic() - down_at + 1  # since the first failure, rounded
        during.append(enqueue_update(profile, dark_mode=True))  # the next summary is not due yet
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert lines[4].getMessage().startswith(f"safeupdates: request {during[3].request_id} ")
        assert len(lines) == 5  # no traceback, no ERROR from Django's on_commit
        assert all(r.exc_info is None for r in caplog.records)
        assert set(ProcessedRequest.objects.filter(pk__in=[r.pk for r in during]).values_list("status", flat=True)) == {
            "pending"
        }

        caplog.clear()
        own_redis.start()
        enqueue_update(ProfileFactory(), active=True)
        [back] = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert back.getMessage().startswith(f"safeupdates: Redis at {where} is reachable again after ")
        assert back.getMessage().endswith("; 4 request(s) saved meanwhile wait for the relay (safeupdates_relay).")
        after = float(back.getMessage().split(" reachable again after ", 1)[1].split(" s;", 1)[0])
        assert 1 <= after <= time.monotonic() - down_at + 1  # since the first failure (0.6 s slept), rounded
        assert relay_pending(0) == 1  # the first record, whose jobs were lost; the second one's job waits
