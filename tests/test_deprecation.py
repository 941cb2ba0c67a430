"""The old import paths of the job tools: they still work, warn with the release that removes them, and
jobs queued under them still run, also in a worker that turns DeprecationWarnings into errors."""

from __future__ import annotations

import importlib
import uuid

import django_rq
import pytest
from packaging.version import Version

import safeupdates
from safeupdates.deprecation import MOVED, REMOVED_IN
from safeupdates.models import ProcessedRequest
from tests.testapp.jobs import runs
from tests.workers import wait_until

OLD_NAMES = [
    ("safeupdates", "fan_out", "safeupdates.contrib.batches.jobs"),
    ("safeupdates", "enqueue", "safeupdates.contrib.controls.jobs"),
    ("safeupdates", "idempotent", "safeupdates.contrib.idempotent.decorators"),
    ("safeupdates.batches", "fan_out", "safeupdates.contrib.batches.jobs"),
    ("safeupdates.batches", "relay_batches", "safeupdates.contrib.batches.jobs"),
    ("safeupdates.batches", "deliver_item", "safeupdates.contrib.batches.jobs"),
    ("safeupdates.batches", "deliver_reduce", "safeupdates.contrib.batches.jobs"),
    ("safeupdates.controls", "enqueue", "safeupdates.contrib.controls.jobs"),
    ("safeupdates.controls", "parse_throttle", "safeupdates.contrib.controls.jobs"),
    ("safeupdates.controls", "MAX_DEFERRALS", "safeupdates.contrib.controls.jobs"),
    ("safeupdates.controls", "REAP_GRACE", "safeupdates.contrib.controls.jobs"),
    ("safeupdates.controls", "UNIQUE_TTL", "safeupdates.contrib.controls.jobs"),
    ("safeupdates.controls", "InvalidControl", "safeupdates.exceptions"),
    ("safeupdates.idempotency", "idempotent", "safeupdates.contrib.idempotent.decorators"),
    ("safeupdates.idempotency", "SKIPPED", "safeupdates.contrib.idempotent.decorators"),
    ("safeupdates.idempotency", "TASK_NAMESPACE", "safeupdates.contrib.idempotent.decorators"),
    ("safeupdates.idempotency", "task_log_key", "safeupdates.contrib.idempotent.decorators"),
    ("safeupdates.models", "Batch", "safeupdates.contrib.batches.models"),
    ("safeupdates.models", "BatchStatus", "safeupdates.contrib.batches.models"),
]
#: The job functions that queued jobs name: imported without a warning (see the worker test below).
QUEUED_JOBS = [
    ("safeupdates.batches", "run_batch_item", "safeupdates.contrib.batches.jobs"),
    ("safeupdates.batches", "run_batch_reduce", "safeupdates.contrib.batches.jobs"),
    ("safeupdates.controls", "controlled_call", "safeupdates.contrib.controls.jobs"),
    ("safeupdates.controls", "reap_if_abandoned", "safeupdates.contrib.controls.jobs"),
]


@pytest.mark.parametrize(("old", "name", "new"), OLD_NAMES, ids=[f"{old}.{name}" for old, name, _ in OLD_NAMES])
def test_an_old_name_warns_and_names_the_release_that_removes_it(old, name, new):
    module = importlib.import_module(old)
    app = new.rsplit(".", 1)[0]
    where = f" (with {app!r} in INSTALLED_APPS)" if ".contrib." in new else ""
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(module, name)
    assert [str(warning.message) for warning in caught] == [
        f"{old}.{name} is deprecated and will be removed in safeupdates {REMOVED_IN}: import {name} from {new} "
        f"instead{where}."
    ]
    assert caught[0].filename == __file__  # it points at the line that used the old name
    assert value is getattr(importlib.import_module(new), name)


def test_from_import_of_an_old_name_warns_too():
    with pytest.warns(DeprecationWarning, match=r"^safeupdates\.idempotency\.idempotent is deprecated"):
        from safeupdates.idempotency import idempotent  # noqa: F401


def test_every_old_name_is_tested_and_the_release_is_ahead():
    listed = {(old, name) for old, names in MOVED.items() for name in names}
    assert listed == {(old, name) for old, name, _ in [*OLD_NAMES, *QUEUED_JOBS]}
    # When this fails, the release that removes them has come: delete the old paths.
    assert Version(safeupdates.__version__) < Version(REMOVED_IN)


def test_a_name_that_never_was_there_is_an_attribute_error():
    with pytest.raises(AttributeError, match=r"^module 'safeupdates.controls' has no attribute 'nope'$"):
        _ = importlib.import_module("safeupdates.controls").nope
    assert not hasattr(safeupdates, "nope")


@pytest.mark.workers
def test_jobs_queued_under_the_old_paths_run_in_a_worker_that_errors_on_deprecation_warnings(workers):
    """Jobs that an older release queued name ``safeupdates.controls.controlled_call``,
    ``safeupdates.batches.run_batch_item`` ...: they run, and the worker logs that they are old."""
    from safeupdates.contrib.batches.jobs import fan_out
    from safeupdates.contrib.batches.models import Batch

    queue = django_rq.get_queue("default")
    batch = fan_out("tests.testapp.jobs.runs", ["old-paths"])  # runs(log) reads Redis, writes nothing
    queue.empty()  # what this release enqueued: replaced by what an older one did
    (item,) = ProcessedRequest.objects.filter(kind="batch_item", key__startswith=str(batch.batch_id))
    jobs = [
        queue.enqueue("safeupdates.controls.controlled_call", "tests.testapp.jobs.record", "old-paths", "controlled"),
        queue.enqueue("safeupdates.controls.reap_if_abandoned", f"gone-{uuid.uuid4()}", "0"),
        queue.enqueue("safeupdates.batches.run_batch_item", str(item.request_id)),
        queue.enqueue("safeupdates.batches.run_batch_reduce", str(batch.batch_id)),
    ]
    workers.start(1, env={"PYTHONWARNINGS": "error::DeprecationWarning"})
    assert wait_until(lambda: all(job.get_status(refresh=True) == "finished" for job in jobs), 60), workers.logs()
    assert [job.return_value() for job in jobs] == [
        "ran controlled",
        f"job {jobs[1].args[0]} is gone: nothing to reap",
        "succeeded",
        "nothing to do",  # the batch has no reduce
    ]
    assert [run["label"] for run in runs("old-paths")] == ["controlled"]
    assert Batch.objects.get(pk=batch.pk).succeeded == 1
    assert workers.logs().count("a job queued under the old path") == 4
