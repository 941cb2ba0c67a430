import pytest

from safeupdates import enqueue_update
from safeupdates.models import ProcessedRequest
from tests.testapp.models import Profile
from tests.workers import wait_until


@pytest.mark.workers
def test_worker_smoke(workers):
    p = Profile.objects.create(name="a")
    r1 = enqueue_update(p, active=True)
    r2 = enqueue_update(p, active=False)
    workers.start(1)
    assert wait_until(lambda: not ProcessedRequest.objects.filter(status="pending").exists(), 30)
    p.refresh_from_db()
    print(list(ProcessedRequest.objects.values_list("status", "version", "attempts", "error")))
    assert p.active is False
