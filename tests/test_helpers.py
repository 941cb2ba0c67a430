"""The test helpers of ``tests/workers.py``: a helper that hides a failure hides a bug."""

from __future__ import annotations

import itertools

import pytest

from tests.workers import run_threads, start_threads, wait_until


def boom() -> None:
    raise ValueError("raised in a thread")


def test_run_threads_raises_what_a_thread_raised():
    with pytest.raises(ValueError, match="raised in a thread"):
        run_threads(boom, 3)


def test_joining_a_started_thread_raises_what_it_raised():
    [thread] = start_threads(boom, 1)
    with pytest.raises(ValueError, match="raised in a thread"):
        thread.join()


def test_a_wait_on_work_that_progresses_outlasts_its_timeout():
    """The work ends after 40 polls (two seconds), twenty times the timeout: each poll sees progress."""
    polls = itertools.count()
    done = iter([False] * 40 + [True])
    assert wait_until(lambda: next(done), 0.1, 0.05, progress=lambda: next(polls))


def test_a_wait_on_work_that_stalls_gives_up_after_its_timeout():
    answers = []
    assert not wait_until(lambda: answers.append(False), 0.2, 0.05, progress=lambda: "the same")
    assert len(answers) >= 2  # polled until the bound, then once more


@pytest.mark.django_db(transaction=True)
def test_meanwhile_runs_its_action_once_for_the_first_save_and_raises_what_it_raised():
    from tests.factories import ProfileFactory
    from tests.testapp.models import Profile
    from tests.workers import meanwhile

    profile = ProfileFactory(name="a")
    seen: list[str] = []
    with meanwhile(Profile, lambda instance: seen.append(instance.name)) as ran:
        profile.name = "b"
        profile.save()
        profile.save()
    assert (ran, seen) == ([profile], ["b"])
    profile.save()  # outside the block: nothing runs
    assert seen == ["b"]

    def boom(instance: object) -> None:
        raise ValueError("raised meanwhile")

    with pytest.raises(ValueError, match="raised meanwhile"), meanwhile(Profile, boom):
        profile.save()
