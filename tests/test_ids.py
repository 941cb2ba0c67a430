"""External event ids (a webhook's) mapped to request ids: ``safeupdates.ids.request_id_for``."""

from __future__ import annotations

import uuid

import pytest

from safeupdates.exceptions import InvalidUpdate
from safeupdates.ids import request_id_for
from safeupdates.models import ProcessedRequest
from tests.factories import ProfileFactory


def test_the_same_event_of_the_same_source_is_the_same_request_id():
    first = request_id_for("stripe", "evt_1")
    assert isinstance(first, uuid.UUID) and first.version == 5
    assert request_id_for("stripe", "evt_1") == first
    assert request_id_for("stripe", "evt_2") != first
    assert request_id_for("github", "evt_1") != first  # one source's ids never collide with another's


def test_a_uuid_namespace_of_your_own_is_used_as_it_is():
    namespace = uuid.uuid4()
    assert request_id_for(namespace, "evt_1") == uuid.uuid5(namespace, "evt_1")


@pytest.mark.parametrize(("source", "external_id"), [("", "evt_1"), ("stripe", ""), ("stripe", "  "), ("s", 5)])
def test_an_empty_source_or_id_is_refused(source, external_id):
    # An empty id would map every event to one request id: all but the first would be dropped.
    with pytest.raises(InvalidUpdate):
        request_id_for(source, external_id)


@pytest.mark.django_db
def test_a_redelivered_webhook_is_recorded_once():
    from safeupdates import enqueue_update

    profile = ProfileFactory()
    for _ in range(2):
        enqueue_update(profile, request_id=request_id_for("billing", "evt_42"), active=True)
    assert ProcessedRequest.objects.filter(object_id=str(profile.pk)).count() == 1
