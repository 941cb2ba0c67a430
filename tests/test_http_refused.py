"""A value a view's save refuses (no column can hold it) is a 400 that tells the client only what it may
see: the field and the problem for a field the view shows (its ``conflict_fields``), a generic sentence
for a value the view set in a field the client never sees. The server's log has the whole message."""

from __future__ import annotations

import json
import logging
import pickle
from typing import Any

import pytest

from safeupdates.exceptions import InvalidUpdate
from safeupdates.refusals import REFUSED_VALUE, ToldRefusal, told_refusal
from tests import http_urls
from tests.factories import ProfileFactory
from tests.testapp.models import Profile

pytestmark = [pytest.mark.urls("tests.http_urls"), pytest.mark.django_db]

#: Values the view sets in fields its client never sees, each refused by the save, and a piece of each
#: that must not reach the client.
HIDDEN = {
    "a lone surrogate in a note": ({"note": "secret-7f3a\ud800"}, "secret-7f3a"),
    "a NUL in a note": ({"note": "token-91bc\x00"}, "token-91bc"),
    "an int out of range": ({"score": 2**31 + 424242}, "2147907890"),
}
URLS = ["/noting/{}/", "/cbv-noting/{}/"]


@pytest.fixture(autouse=True)
def view_sets():
    http_urls.VIEW_SETS.clear()
    yield http_urls.VIEW_SETS
    http_urls.VIEW_SETS.clear()


def put(client, url, data):
    return client.put(url, json.dumps(data), content_type="application/json")


@pytest.mark.parametrize("url", URLS, ids=["conditional", "ConditionalMixin"])
@pytest.mark.parametrize(("sets", "secret"), list(HIDDEN.values()), ids=list(HIDDEN))
def test_a_refused_value_of_a_field_not_shown_is_not_in_the_400(client, caplog, url, sets, secret):
    profile = ProfileFactory(name="ann")
    http_urls.VIEW_SETS.update(sets)
    with caplog.at_level(logging.WARNING, logger="safeupdates"):
        response = put(client, url.format(profile.pk), {"name": "bob"})
    told_nothing_logged_all(response, caplog, sets, secret)
    assert Profile.objects.get().name == "ann"  # nothing was written


def told_nothing_logged_all(response: Any, caplog: Any, sets: dict[str, Any], secret: str) -> None:
    """``response`` is the 400 of a value the view set in a field its client never sees (``sets``): the
    generic sentence, with neither the field nor ``secret`` (a piece of the value); the server's log has
    them both."""
    assert response.status_code == 400, response.content
    assert response.json() == {"detail": REFUSED_VALUE}
    [name] = sets
    assert secret not in response.content.decode() and name not in response.content.decode()
    [line] = [r.getMessage() for r in caplog.records if r.name == "safeupdates" and "refused" in r.getMessage()]
    assert f"testapp.Profile.{name}=" in line and secret in line


@pytest.mark.parametrize("url", URLS, ids=["conditional", "ConditionalMixin"])
def test_a_refused_value_of_a_field_shown_names_it(client, url):
    profile = ProfileFactory(name="ann")
    response = put(client, url.format(profile.pk), {"name": "n" * 25})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == "name"
    assert "testapp.Profile.name" in body["detail"] and "at most 20" in body["detail"]
    assert len(body["detail"]) < 200  # the client's own value, cut short


@pytest.mark.parametrize("url", URLS, ids=["conditional", "ConditionalMixin"])
def test_a_field_shown_is_named_and_a_field_not_shown_is_not_when_both_are_refused(client, url):
    profile = ProfileFactory(name="ann")
    http_urls.VIEW_SETS.update(note="secret-7f3a\ud800")
    response = put(client, url.format(profile.pk), {"name": "n" * 25})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "name"
    assert "secret-7f3a" not in response.content.decode() and "note" not in response.content.decode()


class TestToldRefusal:
    """An InvalidUpdate that says which field and why (``field``, ``reason``): told by those, never by its message."""

    def refusal(self, **attributes):
        return InvalidUpdate("testapp.Profile.note='secret-7f3a' is refused.", **attributes)

    def test_a_field_shown_is_told_by_its_reason(self):
        exc = self.refusal(
            model="testapp.Profile", field="name", reason="has 25 characters, and the column holds at most 20."
        )
        told = told_refusal(exc, Profile, ["name", "active"], surface="test")
        assert told == ToldRefusal("testapp.Profile.name has 25 characters, and the column holds at most 20.", "name")

    @pytest.mark.parametrize(
        "attributes",
        [
            {"model": "testapp.Profile", "field": "note", "reason": "is refused."},  # a field not shown
            {"model": "testapp.Document", "field": "name", "reason": "is refused."},  # another model's field
            {},  # nothing known but the message
        ],
        ids=["not shown", "another model", "unknown"],
    )
    def test_anything_else_is_the_generic_sentence(self, attributes):
        told = told_refusal(self.refusal(**attributes), Profile, ["name", "active"], surface="test")
        assert told == ToldRefusal(REFUSED_VALUE)

    def test_a_reason_about_no_field_is_told_as_it_is(self):
        told = told_refusal(self.refusal(reason="the edit token is not valid."), Profile, None, surface="test")
        assert told == ToldRefusal("the edit token is not valid.")

    def test_the_attributes_survive_pickling(self):
        exc = pickle.loads(pickle.dumps(self.refusal(model="testapp.Profile", field="note", reason="is refused.")))
        assert (str(exc), exc.model, exc.field, exc.reason) == (
            "testapp.Profile.note='secret-7f3a' is refused.",
            "testapp.Profile",
            "note",
            "is refused.",
        )

    def test_located_takes_the_reason_after_the_prefix_its_raiser_wrote(self):
        exc = self.refusal().located("testapp.Profile", "note", "testapp.Profile.note='secret-7f3a'")
        assert (exc.model, exc.field, exc.reason) == ("testapp.Profile", "note", "is refused.")
        assert str(exc) == "testapp.Profile.note='secret-7f3a' is refused."  # the message stays whole
        other = self.refusal().located("testapp.Profile", "name", "testapp.Profile.name=")
        assert (other.model, other.field, other.reason) == (None, None, None)  # not its prefix
        again = exc.located("testapp.Document", "title", "testapp.Profile.note=")
        assert (again.model, again.field) == ("testapp.Profile", "note")  # the first says


@pytest.mark.parametrize("url", URLS, ids=["conditional", "ConditionalMixin"])
def test_a_refused_value_of_a_field_shown_is_told_by_its_reason_without_the_value(client, url):
    profile = ProfileFactory(name="ann")
    response = put(client, url.format(profile.pk), {"name": "n" * 25})
    assert response.json() == {
        "detail": "testapp.Profile.name has 25 characters, and the column holds at most 20.",
        "field": "name",
    }


def test_each_write_path_says_which_field_it_refused_and_why():
    """update_if_newer() (clean_changes), a checked save() (check_saved) and a value the database driver
    refuses (the save's conversion): the refusal names the model and the field, and its reason quotes no value."""
    from safeupdates.versions import next_version
    from tests.testapp.models import Document

    profile = ProfileFactory(name="ann")
    with pytest.raises(InvalidUpdate) as by_update:
        Profile.objects.update_if_newer(profile.pk, version=next_version(), name="n" * 25)
    document = Document.objects.create(title="t")
    document.title = "t" * 101
    with pytest.raises(InvalidUpdate) as by_save:
        document.save()
    refusals = [(exc.value.model, exc.value.field, exc.value.reason) for exc in (by_update, by_save)]
    assert refusals == [
        ("testapp.Profile", "name", "is invalid: Ensure this value has at most 20 characters (it has 25)."),
        ("testapp.Document", "title", "has 101 characters, and the column holds at most 100."),
    ]
