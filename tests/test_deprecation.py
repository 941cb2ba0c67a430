"""The old import paths: of the job tools, and of the flat modules that the wings replaced. They still
work, warn with the release that removes them, and jobs queued under them still run, also in a worker
that turns DeprecationWarnings into errors; the wire path of the apply task serves it without a warning."""

from __future__ import annotations

import importlib
import uuid
import warnings
from pathlib import Path

import django_rq
import pytest
from packaging.version import Version

import safeupdates
from safeupdates.deprecation import MOVED, MOVED_MODULES, QUEUED_JOBS, REMOVED_IN, WIRE_PATHS
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
    ("safeupdates.lifecycle", "newest_per_field", "safeupdates.write.merge"),
    ("safeupdates.delivery", "Attempt", "safeupdates.delivery.tasks"),
    ("safeupdates.delivery", "current_attempt", "safeupdates.delivery.tasks"),
    ("safeupdates.delivery", "running", "safeupdates.delivery.tasks"),
    # Modules that the wings replaced: a name of each, and every name that went elsewhere than the rest.
    ("safeupdates.base", "LockVersionMixin", "safeupdates.write.mixins"),
    ("safeupdates.base", "SafeUpdateModel", "safeupdates.models"),
    ("safeupdates.guard", "write_if_newer", "safeupdates.write.guard"),
    ("safeupdates.guard", "statement_cursor", "safeupdates.database.cursors"),
    ("safeupdates.guard", "stored_version", "safeupdates.database.statements"),
    ("safeupdates.guard", "versions_model", "safeupdates.database.registry"),
    ("safeupdates.bulk", "bulk_update_if_newer", "safeupdates.write.bulk"),
    ("safeupdates.validation", "clean_changes", "safeupdates.write.validation"),
    ("safeupdates.meta", "request_log", "safeupdates.database.registry"),
    ("safeupdates.statements", "guarded_update", "safeupdates.database.statements"),
    ("safeupdates.internals", "update_returning", "safeupdates.database.internals"),
    ("safeupdates.db", "after_commit", "safeupdates.database.transactions"),
    ("safeupdates.db", "database_now", "safeupdates.database.clock"),
    ("safeupdates.db", "is_lock_unavailable", "safeupdates.database.errors"),
    ("safeupdates.enqueuing", "enqueue_update", "safeupdates.pipeline.enqueue"),
    ("safeupdates.apply", "apply_update", "safeupdates.pipeline.apply"),
    ("safeupdates.apply", "is_transient", "safeupdates.database.errors"),
    ("safeupdates.relay", "relay", "safeupdates.pipeline.relay"),
    ("safeupdates.relay", "unreachable_database", "safeupdates.database.errors"),
    ("safeupdates.queues", "get_queue", "safeupdates.delivery.rq"),
    ("safeupdates.taskqueue", "coalesces", "safeupdates.delivery.tasks"),
    ("safeupdates.attempts", "Attempt", "safeupdates.delivery.tasks"),
    ("safeupdates.attempts", "current_job_id", "safeupdates.delivery"),
    ("safeupdates.admin_log", "RequestLogPaginator", "safeupdates.admin.requestlog"),
    ("safeupdates.admin_status", "StatusPageMixin", "safeupdates.admin.status"),
]
# Every name of an old module that went elsewhere than the module's other names (a renamed one: its new name).
OLD_NAMES += [
    (old, name, target)
    for old, (_default, elsewhere) in MOVED_MODULES.items()
    for name, target in elsewhere.items()
    if (old, name, target) not in OLD_NAMES
]
#: The job functions that queued jobs name: imported without a warning (see the worker test below).
OLD_QUEUED_JOBS = [
    ("safeupdates.batches", "run_batch_item", "safeupdates.contrib.batches.jobs"),
    ("safeupdates.batches", "run_batch_reduce", "safeupdates.contrib.batches.jobs"),
    ("safeupdates.controls", "controlled_call", "safeupdates.contrib.controls.jobs"),
    ("safeupdates.controls", "reap_if_abandoned", "safeupdates.contrib.controls.jobs"),
]


@pytest.mark.parametrize(("old", "name", "new"), OLD_NAMES, ids=[f"{old}.{name}" for old, name, _ in OLD_NAMES])
def test_an_old_name_warns_and_names_the_release_that_removes_it(old, name, new):
    module = importlib.import_module(old)
    app = new.partition(":")[0].rsplit(".", 1)[0]
    where = f" (with {app!r} in INSTALLED_APPS)" if ".contrib." in new else ""
    new, _, new_name = new.partition(":")
    new_name = new_name or name
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(module, name)
    assert [str(warning.message) for warning in caught] == [
        f"{old}.{name} is deprecated and will be removed in safeupdates {REMOVED_IN}: import {new_name} from {new} "
        f"instead{where}."
    ]
    assert caught[0].filename == __file__  # it points at the line that used the old name
    assert value is getattr(importlib.import_module(new), new_name)


def test_from_import_of_an_old_name_warns_too():
    with pytest.warns(DeprecationWarning, match=r"^safeupdates\.idempotency\.idempotent is deprecated"):
        from safeupdates.idempotency import idempotent  # noqa: F401


def test_every_old_name_is_tested_and_the_release_is_ahead():
    listed = {(old, name) for old, names in MOVED.items() for name in names}
    listed |= {(old, name) for old, (_default, elsewhere) in MOVED_MODULES.items() for name in elsewhere}
    listed |= {(old, name) for old, names in QUEUED_JOBS.items() for name in names}
    tested = {(old, name) for old, name, _ in [*OLD_NAMES, *OLD_QUEUED_JOBS]}
    assert listed <= tested
    assert {old for old, _name, _new in OLD_NAMES} >= set(MOVED_MODULES) - set(QUEUED_JOBS)
    # When this fails, the release that removes them has come: delete the old paths.
    assert Version(safeupdates.__version__) < Version(REMOVED_IN)


def test_no_file_stands_for_an_old_module():
    """The top level holds the public face: an old module is made on import, it has no file of its own."""
    package = Path(safeupdates.__file__).parent
    for old in MOVED_MODULES:
        leaf = old.rpartition(".")[2]
        assert not (package / f"{leaf}.py").exists() and not (package / leaf).is_dir(), old
        assert importlib.import_module(old).__spec__.origin is None, old


def test_user_code_that_imports_an_old_module_still_runs(recwarn):
    """What a project wrote against 0.1's modules: the module imports, a name from it warns and works."""
    from safeupdates.queues import get_queue  # noqa: F401 (a name of RQ's module, as contrib tools used it)

    assert [str(w.message).split(":")[0] for w in recwarn.list] == [
        "safeupdates.queues.get_queue is deprecated and will be removed in safeupdates " + REMOVED_IN
    ]


def test_the_apply_tasks_wire_path_serves_the_task_without_a_warning():
    """Stored and queued tasks name ``safeupdates.taskqueue.apply_update``: a worker that turns warnings
    into errors imports it, and it is the task whose module path it is."""
    from django.utils.module_loading import import_string

    from safeupdates.delivery import tasks

    assert WIRE_PATHS == {"safeupdates.taskqueue": ("apply_update",)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task = import_string(tasks.APPLY_TASK)
    assert task is tasks.apply_update
    assert task.module_path == tasks.APPLY_TASK == "safeupdates.taskqueue.apply_update"


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
