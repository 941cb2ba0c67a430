"""The examples of docs/deployment.md, run as written."""

from __future__ import annotations

import re
import shlex
from io import StringIO

import django_rq
import pytest
from django.core.management import call_command

from safeupdates import enqueue_update
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory
from tests.workers import ROOT

DEPLOYMENT = (ROOT / "docs" / "deployment.md").read_text()


def block_after(marker: str, language: str) -> list[str]:
    """The lines of the first ``language`` block after ``marker`` in docs/deployment.md."""
    start = DEPLOYMENT.index(marker)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(DEPLOYMENT, start)
    assert match, (marker, language)
    return match[1].splitlines()


@pytest.mark.django_db(transaction=True)
def test_the_retry_failed_example_runs_as_written(redis, settings):
    settings.SAFEUPDATES_RELAY_AFTER = 30  # the default, which the example shows
    failed = [enqueue_update(ProfileFactory(), active=True) for _ in range(2)]
    ProcessedRequest.objects.filter(pk__in=[r.pk for r in failed]).update(status="failed", error="outage")
    django_rq.get_queue("default").empty()
    commands = [shlex.split(line.split("#")[0]) for line in block_after("--retry-failed`.**", "console")]
    assert [command[:3] for command in commands] == [["python", "manage.py", "safeupdates_relay"]] * 2
    outputs = []
    for command in commands:
        out = StringIO()
        call_command(*command[2:], stdout=out)
        outputs.append(out.getvalue().strip())
    # The dry run counts the failed requests' records as due, as the real pass then delivers them.
    assert outputs[0] == (
        "safeupdates relay: 2 failed request(s) would be made pending again; "
        "would deliver 2 job(s) for work pending > 30s"
    )
    assert outputs[1:] == block_after("--retry-failed`.**", "text")
    assert set(ProcessedRequest.objects.values_list("status", flat=True)) == {"pending"}
    assert django_rq.get_queue("default").count == 2
