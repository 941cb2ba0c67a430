"""Django REST framework: a value the save refuses is a 400 that names a field only if the serializer
shows it, and never quotes a value the view set in a field the client never sees."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip(
    "rest_framework", reason="Django REST framework is not installed: pip install 'django-safeupdates[drf]'"
)

from rest_framework.test import APIClient

from tests import drf_urls
from tests.factories import ProfileFactory
from tests.test_http_refused import HIDDEN, told_nothing_logged_all
from tests.testapp.models import Everything, Profile

pytestmark = [pytest.mark.urls("tests.drf_urls"), pytest.mark.django_db]


@pytest.fixture
def api():
    drf_urls.VIEW_SETS.clear()
    yield APIClient()
    drf_urls.VIEW_SETS.clear()


@pytest.mark.parametrize("method", ["patch", "post"], ids=["update", "create"])
@pytest.mark.parametrize(("sets", "secret"), list(HIDDEN.values()), ids=list(HIDDEN))
def test_a_refused_value_of_a_field_not_shown_is_not_in_the_400(api, caplog, method, sets, secret):
    profile = ProfileFactory(name="ann")
    drf_urls.VIEW_SETS.update(sets)
    url = f"/noting/{profile.pk}/" if method == "patch" else "/noting/"
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        response = getattr(api, method)(url, {"name": "bob"}, "json")
    told_nothing_logged_all(response, caplog, sets, secret)
    assert list(Profile.objects.values_list("name", flat=True)) == ["ann"]  # nothing was written


@pytest.mark.parametrize("method", ["patch", "post"], ids=["update", "create"])
def test_a_refused_value_of_a_field_shown_is_that_fields_error(api, method):
    """The client sent it: the 400 is the field's error, as a serializer's own, the value cut short."""
    pk = Everything.objects.create().pk
    url = f"/everything/{pk}/" if method == "patch" else "/everything/"
    response = getattr(api, method)(url, '{"data": {"\\udfff": 1}}', content_type="application/json")
    assert response.status_code == 400, response.content
    [(field, [message])] = response.json().items()
    assert field == "data" and "testapp.Everything.data" in message and "surrogate" in message
    assert len(message) < 300
