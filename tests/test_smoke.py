import pytest

from tests.testapp.models import Profile


@pytest.mark.django_db
def test_smoke():
    p = Profile.objects.create(name="a")
    assert p.lock_version > 0
    r = Profile.objects.update_if_newer(p.pk, version=p.lock_version + 1000, active=True)
    assert r.applied, r
    p.refresh_from_db()
    print(p.field_versions, p.lock_version)
    r2 = Profile.objects.update_if_newer(p.pk, version=p.lock_version - 1, active=False)
    assert not r2.applied
    import uuid
    rid = uuid.uuid4()
    r3 = Profile.objects.update_if_newer(p.pk, version=p.lock_version + 5, request_id=rid, newsletter=True)
    r4 = Profile.objects.update_if_newer(p.pk, version=p.lock_version + 5, request_id=rid, newsletter=True)
    print(r3, r4)
