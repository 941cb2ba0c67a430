"""The Prometheus metrics of safeupdates.contrib.prometheus: values and labels after a known burst, in
this process and summed over real worker processes (multiprocess mode), the request log's gauges (one
query, cached), and who may read the view."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from safeupdates import enqueue_update, signals
from safeupdates.contrib.prometheus import metrics
from safeupdates.exceptions import LockUnavailable, NeverLoadedError, StaleObjectError
from safeupdates.http import etag_for
from safeupdates.jobs import apply_update, relay
from safeupdates.models import ProcessedRequest
from safeupdates.versions import next_version
from tests.factories import ProfileFactory
from tests.testapp.models import Profile
from tests.workers import RowLock, wait_until

TOKEN = "s3cret-token"


def scrape(client, **headers) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The metrics view's samples: ``{(name, sorted labels): value}``."""
    response = client.get(reverse("safeupdates_metrics"), **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def token_client(client):
    with override_settings(SAFEUPDATES_METRICS_TOKEN=TOKEN):
        yield lambda: scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")


@pytest.mark.django_db(transaction=True)
def test_counters_after_a_known_burst(redis, token_client):
    """In this process (no multiprocess mode): requests by outcome, fields written or held, latencies,
    stale saves, relay deliveries and revivals."""
    before = token_client()
    profile = ProfileFactory()
    held_by_row = enqueue_update(profile, newsletter=True)
    Profile.objects.update_if_newer(profile.pk, version=next_version(), newsletter=False)
    with transaction.atomic():
        older = enqueue_update(profile, active=True)
        enqueue_update(profile, active=False)
    apply_update(str(older.request_id))  # 1 applied (active), 2 stale (active, newsletter)
    apply_update(str(held_by_row.request_id))  # a duplicate delivery
    refused = enqueue_update(profile, score=-13)
    apply_update(str(refused.request_id))  # rejected
    signals.stale_save_refused_robust(
        Profile, pk=profile.pk, version=1, fields=("name",), surface="admin", using="default"
    )
    enqueue_update(ProfileFactory(), active=True)
    failed = enqueue_update(ProfileFactory(), active=True)
    ProcessedRequest.objects.fail(failed.request_id, "OperationalError: gone", final=True)
    redis.flushdb()  # their jobs are lost: the relay delivers them again
    report = relay(0, retry_failed=True)
    assert (report.enqueued, report.revived) == (2, 1)
    after = token_client()

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    model = "testapp.Profile"
    assert {
        outcome: delta("safeupdates_requests_total", model=model, outcome=outcome)
        for outcome in ("applied", "stale", "duplicate", "rejected", "failed")
    } == {"applied": 1, "stale": 2, "duplicate": 1, "rejected": 1, "failed": 1}
    assert delta("safeupdates_field_writes_total", model=model, field="active", outcome="applied") == 1
    assert delta("safeupdates_field_writes_total", model=model, field="active", outcome="stale") == 1
    assert delta("safeupdates_field_writes_total", model=model, field="newsletter", outcome="stale") == 1
    # Latency of each recorded outcome (not of the duplicate, which records nothing).
    assert delta("safeupdates_request_latency_seconds_count", model=model) == 5
    assert delta("safeupdates_request_latency_seconds_bucket", model=model, le="+Inf") == 5
    assert delta("safeupdates_stale_saves_total", model=model, surface="admin") == 1
    assert delta("safeupdates_relay_deliveries_total") == 2
    assert delta("safeupdates_relay_revivals_total") == 1


@pytest.mark.django_db
def test_counting_goes_on_after_a_counter_is_cleared(token_client):
    """The counters are public: after ``clear()`` (a test's reset, say) the next outcome is counted and
    shown again, from 1."""
    count = metrics._RECEIVERS["applied"]
    count(Profile, fields=("active",), held={}, latency=0.0)
    metrics.REQUESTS.clear()
    metrics.FIELD_WRITES.clear()
    count(Profile, fields=("active",), held={}, latency=0.0)
    samples = token_client()
    assert value(samples, "safeupdates_requests_total", model="testapp.Profile", outcome="applied") == 1
    assert (
        value(samples, "safeupdates_field_writes_total", model="testapp.Profile", field="active", outcome="applied")
        == 1
    )


@pytest.mark.django_db(transaction=True)
def test_stale_saves_by_surface_after_a_known_set_of_refusals(token_client, rf):
    """Each refusal counted once, under the surface that refused it: two saves (one of a row this
    instance never loaded), a delete, a form with an old token, an If-Match naming an older version."""
    from tests import http_urls
    from tests.forms_views import ProfileForm

    before = token_client()
    profile = ProfileFactory(name="a")
    stale = Profile.objects.get(pk=profile.pk)
    form = ProfileForm(instance=Profile.objects.get(pk=profile.pk))
    shown = {**form.initial, "safeupdates_token": form.initial["safeupdates_token"]}
    etag = etag_for(profile)
    profile.save()  # the row moves on
    with pytest.raises(StaleObjectError):
        stale.save()
    with pytest.raises(NeverLoadedError):
        Profile(pk=profile.pk).save()
    with pytest.raises(StaleObjectError):
        stale.delete()
    # An edit of a field the row's full save wrote since (a form that changes nothing is no conflict).
    assert not ProfileForm(data={**shown, "name": "b"}, instance=Profile.objects.get(pk=profile.pk)).is_valid()
    request = rf.put(f"/profiles/{profile.pk}/", "{}", content_type="application/json", headers={"if_match": etag})
    assert http_urls.profile_view(request, pk=profile.pk).status_code == 412
    profile.save()  # accepted: not counted
    after = token_client()
    counted = "safeupdates_stale_saves_total"
    assert {
        surface: value(after, counted, model="testapp.Profile", surface=surface)
        - value(before, counted, model="testapp.Profile", surface=surface)
        for surface in ("save", "delete", "form", "http", "admin", "drf")
    } == {"save": 2, "delete": 1, "form": 1, "http": 1, "admin": 0, "drf": 0}


@pytest.mark.django_db(transaction=True)
def test_lock_timeouts_are_counted(postgres_only, token_client):
    profile = ProfileFactory()
    before = token_client()
    with (
        RowLock(Profile, profile.pk),
        pytest.raises(LockUnavailable),
        Profile.objects.with_lock(profile.pk, nowait=True),
    ):
        pass
    after = token_client()
    labels = {"model": "testapp.Profile", "surface": "with_lock"}
    count = "safeupdates_lock_timeouts_total"
    assert value(after, count, **labels) - value(before, count, **labels) == 1


@pytest.mark.django_db(transaction=True)
def test_gauges_come_from_one_cached_query(redis, token_client):
    profile = ProfileFactory()
    old = enqueue_update(profile, active=True)
    enqueue_update(profile, newsletter=True, queue="fast")
    enqueue_update(ProfileFactory(), newsletter=True, queue="fast")
    ProcessedRequest.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(seconds=300))
    with override_settings(SAFEUPDATES_METRICS_CACHE=0), CaptureQueriesContext(connection) as queries:
        samples = token_client()
    reads = [q["sql"] for q in queries.captured_queries if "safeupdates_processedrequest" in q["sql"]]
    assert len(reads) == 1 and "GROUP BY" in reads[0]
    assert value(samples, "safeupdates_pending_requests", model="testapp.Profile", queue="default") == 1
    assert value(samples, "safeupdates_pending_requests", model="testapp.Profile", queue="fast") == 2
    assert (
        300 <= value(samples, "safeupdates_oldest_pending_age_seconds", model="testapp.Profile", queue="default") < 360
    )
    assert value(samples, "safeupdates_oldest_pending_age_seconds", model="testapp.Profile", queue="fast") < 60

    ProcessedRequest.objects.filter(pk=old.pk).delete()
    with override_settings(SAFEUPDATES_METRICS_CACHE=60), CaptureQueriesContext(connection) as queries:
        cached = token_client()
    assert not [q for q in queries.captured_queries if "safeupdates_processedrequest" in q["sql"]]
    assert value(cached, "safeupdates_pending_requests", model="testapp.Profile", queue="default") == 1  # cached
    with override_settings(SAFEUPDATES_METRICS_CACHE=0):
        fresh = token_client()
    assert value(fresh, "safeupdates_pending_requests", model="testapp.Profile", queue="default") == 0


@pytest.mark.django_db
def test_who_may_read_the_metrics(client, django_user_model):
    url = reverse("safeupdates_metrics")
    assert client.get(url).status_code == 403
    user = django_user_model.objects.create_user("someone", password="x")
    client.force_login(user)
    assert client.get(url).status_code == 403
    user.is_staff = True
    user.save()
    assert client.get(url).status_code == 200
    client.logout()
    with override_settings(SAFEUPDATES_METRICS_TOKEN=TOKEN):
        refused = client.get(url, HTTP_AUTHORIZATION="Bearer wrong")
        assert (refused.status_code, refused["WWW-Authenticate"]) == (403, 'Bearer realm="safeupdates metrics"')
        assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 403  # no token set
    assert client.post(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code in (403, 405)


def test_a_work_horse_writes_its_workers_files(monkeypatch):
    monkeypatch.setenv("RQ_WORKER_ID", "w/1")
    assert metrics._process_identifier() == str(os.getpid())  # the worker itself
    monkeypatch.setattr(metrics, "_STARTED_IN", -1)  # as seen from a forked child
    assert metrics._process_identifier() == "rq-w_1"


@pytest.mark.workers
def test_several_worker_processes(workers, redis, client, tmp_path, monkeypatch):
    """Three workers in prometheus-client's multiprocess mode, one directory: the view sums what every
    worker counted (the apply jobs run in the worker's own process), in a file per worker, not per job."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    profiles = [ProfileFactory() for _ in range(12)]
    requests = []
    for profile in profiles:
        with transaction.atomic():  # one job per record
            requests += [enqueue_update(profile, active=True), enqueue_update(profile, active=False)]
    rejected = enqueue_update(ProfileFactory(), score=-13)
    workers.start(3, env={"PROMETHEUS_MULTIPROC_DIR": str(directory)})
    log = ProcessedRequest.objects.filter(request_id__in=[r.request_id for r in [*requests, rejected]])
    assert wait_until(lambda: not log.filter(status="pending").exists(), 60), workers.logs()
    workers.stop()  # every horse has exited: its counts are in the files
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    with override_settings(SAFEUPDATES_METRICS_TOKEN=TOKEN):
        samples = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    model = "testapp.Profile"
    assert value(samples, "safeupdates_requests_total", model=model, outcome="applied") == 12
    assert value(samples, "safeupdates_requests_total", model=model, outcome="stale") == 12
    assert value(samples, "safeupdates_requests_total", model=model, outcome="rejected") == 1
    assert value(samples, "safeupdates_field_writes_total", model=model, field="active", outcome="applied") == 12
    assert value(samples, "safeupdates_field_writes_total", model=model, field="active", outcome="stale") == 12
    assert value(samples, "safeupdates_request_latency_seconds_count", model=model) == 25
    # Per worker, a file of its own process (and one its work horses would share); not one per job (13+ jobs).
    files = sorted(path.name for path in Path(directory).glob("counter_*.db"))
    assert 1 <= len(files) <= 6, files


def test_the_metrics_use_prometheus_clients_public_api_only():
    """No private attribute of prometheus-client's objects (``metric._metrics`` was read to skip
    ``labels()``): a release may rename it. What is private here is the module's own (and Django's
    ``_meta``, a public API by its documentation)."""
    import ast
    from pathlib import Path

    from safeupdates.contrib.prometheus import metrics

    tree = ast.parse(Path(metrics.__file__).read_text())
    own = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    private = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls", *own})
        and node.attr not in {*own, "_meta"}
    ]
    assert private == [], private
