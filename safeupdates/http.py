"""Conditional requests on a record: ``lock_version`` as its ETag, and ``If-Match`` checked in the write.

A GET (or HEAD) answers with a strong ETag of the record; ``If-None-Match`` gives 304 Not Modified. A
PUT, PATCH, POST or DELETE that sends ``If-Match`` writes only if the row still carries the version that
ETag names, and the check is the write itself: the view gets the record with ``lock_version`` set to
the client's version, so its ``save()`` (or ``delete()``) runs ``UPDATE ... WHERE lock_version =
<client's>``. A row changed by anyone after the client read it -- also between this view's read and its
write -- makes that statement match nothing: ``StaleObjectError``, answered 412 Precondition Failed with
the fields written since the client's version. Django's ``condition()`` compares first and writes later,
and a write that lands in between is silently overwritten.

The ETag is ``"<lock_version>.<signature>"``: the version, so that the write can carry it and the 412
can say what changed since; signed with the model, the primary key and ``SECRET_KEY``, so that one
record's ETag is never valid for another (rows migrated in all share ``lock_version`` 0) and a client
cannot make one up. It carries no values: the client keeps the representation that came with its ETag,
and the 412 body lists what was written since and the value now.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import TYPE_CHECKING, Any, Literal, cast

from django.core import signing
from django.core.exceptions import ObjectDoesNotExist
from django.db import models
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotModified, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.crypto import constant_time_compare
from django.views.generic import View
from django.views.generic.detail import SingleObjectMixin

from safeupdates.conflicts import Conflict, FieldChange, changes_since
from safeupdates.exceptions import StaleObjectError

if TYPE_CHECKING:
    from safeupdates.models import LockVersionMixin

__all__ = [
    "ANY",
    "ConditionalMixin",
    "Decision",
    "MalformedHeader",
    "changes_since",
    "conditional",
    "conflict_body",
    "etag_for",
    "evaluate",
    "parse_etags",
    "respond",
    "version_from_etag",
]

_SALT = "safeupdates.etag"
#: Methods that read; every other method writes (and If-Match is checked in its write).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
#: Fields that bookkeep the versions themselves: never reported as changed.

ANY: Literal["*"] = "*"
# entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE ; etagc = %x21 / %x23-7E / obs-text  (RFC 9110, 8.8.3)
_ENTITY_TAG = re.compile(r'[ \t]*(W/)?"([\x21\x23-\x7e\x80-\xff]*)"[ \t]*(?:,|$)')
_EMPTY_ELEMENT = re.compile(r"[ \t]*,")


class MalformedHeader(ValueError):
    """An If-Match or If-None-Match header that is not ``*`` nor a list of entity tags."""


def etag_for(instance: LockVersionMixin) -> str:
    """The strong, quoted ETag of ``instance`` as loaded: its ``lock_version``, signed for this record."""
    version = instance.lock_version
    return f'"{version}.{_signature(instance, version, None)}"'


def version_from_etag(opaque: str, instance: LockVersionMixin) -> int | None:
    """The ``lock_version`` an ETag (without its quotes) names, if it was made for ``instance``'s record.

    None for an ETag of another record, of another ``SECRET_KEY`` (keys in ``SECRET_KEY_FALLBACKS``
    are accepted, as by :mod:`django.core.signing`), or not made by :func:`etag_for` at all.
    """
    version_text, dot, signature = opaque.partition(".")
    if not dot or not version_text.isascii() or not version_text.isdigit() or len(version_text) > 19:
        return None
    version = int(version_text)
    signer = signing.Signer(salt=_SALT)
    for key in (signer.key, *signer.fallback_keys):
        if constant_time_compare(signature, _signature(instance, version, key)):
            return version
    return None


def _signature(instance: models.Model, version: int, key: Any) -> str:
    # The concrete model: a proxy (or a parent of multi-table inheritance) names the same row.
    label = (instance._meta.concrete_model or type(instance))._meta.label_lower
    return signing.Signer(salt=_SALT).signature(f"{label}:{instance.pk}:{version}", key=key)


def parse_etags(value: str) -> list[tuple[bool, str]] | Literal["*"]:
    """Parse an If-Match / If-None-Match value: ``"*"``, or ``[(weak, opaque tag), ...]``.

    Raises :class:`MalformedHeader` for anything else (an unquoted tag, a stray character, an empty
    list). Empty list elements (``"a", , "b"``) are accepted, as RFC 9110 asks of recipients.
    """
    if value.strip(" \t") == "*":
        return ANY
    tags: list[tuple[bool, str]] = []
    position = 0
    while position < len(value):
        empty = _EMPTY_ELEMENT.match(value, position)
        if empty:
            position = empty.end()
            continue
        if not value[position:].strip(" \t"):
            break
        match = _ENTITY_TAG.match(value, position)
        if match is None:
            raise MalformedHeader(f"not a list of quoted entity tags, nor *: {_shown(value)}")
        tags.append((match.group(1) is not None, match.group(2)))
        position = match.end()
    if not tags:
        raise MalformedHeader(f"no entity tag in {_shown(value)}")
    return tags


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else f"{text[:60]}...")


@dataclass(frozen=True)
class Decision:
    """What the preconditions of a request decide: answer now (``response``) or let the view run.

    When the view runs, ``version`` is the ``lock_version`` its write must find on the row: the one the
    client's If-Match names (None without If-Match, or with ``If-Match: *``: the version loaded).
    """

    response: HttpResponse | None = None
    version: int | None = None


def evaluate(request: HttpRequest, instance: LockVersionMixin, *, require_if_match: bool = False) -> Decision:
    """Evaluate If-Match and If-None-Match against ``instance`` (as loaded), in RFC 9110's order (13.2.2).

    400 for a malformed header; 428 for a write without If-Match when ``require_if_match``; 412 when
    If-Match names no ETag of this record, names an older version (the body lists what changed since),
    or when If-None-Match matches on a write; 304 when If-None-Match matches on a GET or HEAD.
    """
    method = (request.method or "GET").upper()
    writes = method not in SAFE_METHODS
    version: int | None = None
    if_match = request.headers.get("If-Match")
    if if_match is not None:
        try:
            tags = parse_etags(if_match)
        except MalformedHeader as exc:
            return Decision(_error(f"Malformed If-Match header: {exc}. Send the ETag of a GET, quoted.", 400))
        if tags != ANY:
            # Strong comparison: a weak tag never matches (RFC 9110, 13.1.1).
            versions = [
                v for weak, opaque in tags if not weak and (v := version_from_etag(opaque, instance)) is not None
            ]
            if not versions:
                return Decision(
                    _error(
                        f"If-Match names no current ETag of {_label(instance)} {instance.pk} (a weak ETag, "
                        "one of another record, or not one of ours). GET it and send the ETag it answers with.",
                        412,
                    )
                )
            if instance.lock_version not in versions:
                # Refusing early is safe (no write happens); accepting is decided by the write itself.
                return Decision(JsonResponse(conflict_body(changes_since(instance, max(versions))), status=412))
            version = instance.lock_version
    elif writes and require_if_match:
        return Decision(
            _error(
                f"This request must be conditional: send If-Match with the ETag of a GET of "
                f"{_label(instance)} {instance.pk}, so that a change made since is not overwritten.",
                428,
            )
        )
    if_none_match = request.headers.get("If-None-Match")
    if if_none_match is not None:
        try:
            tags = parse_etags(if_none_match)
        except MalformedHeader as exc:
            return Decision(_error(f"Malformed If-None-Match header: {exc}.", 400))
        # Weak comparison (RFC 9110, 13.1.2): W/"x" matches "x".
        if tags == ANY or any(version_from_etag(opaque, instance) == instance.lock_version for _, opaque in tags):
            if not writes:
                not_modified = HttpResponseNotModified()
                not_modified["ETag"] = etag_for(instance)
                return Decision(not_modified)
            return Decision(_error("If-None-Match matches the current ETag: nothing was written.", 412))
    return Decision(version=version)


def respond(
    request: HttpRequest,
    load: Callable[[], LockVersionMixin],
    view: Callable[[LockVersionMixin], HttpResponseBase],
    *,
    require_if_match: bool = False,
) -> HttpResponseBase:
    """Load the record, evaluate the preconditions, run ``view`` with it, and map a lost write to 412/409.

    The record ``view`` receives carries the client's version as ``lock_version``: its ``save()`` and
    ``delete()`` are the check. A ``StaleObjectError`` of that record is answered 412 when the client
    sent a version (If-Match) and 409 when it did not (the row changed while the request ran).
    """
    try:
        instance = load()
    except (ObjectDoesNotExist, Http404):
        if request.headers.get("If-Match") is not None:
            return _error("If-Match: the record does not exist (any more); nothing was written.", 412)
        raise
    decision = evaluate(request, instance, require_if_match=require_if_match)
    if decision.response is not None:
        return decision.response
    expected = instance.lock_version if decision.version is None else decision.version
    instance.lock_version = expected
    try:
        response = view(instance)
    except StaleObjectError:
        current = type(instance)._base_manager.using(instance._state.db).filter(pk=instance.pk).first()
        if current is not None and current.lock_version == expected:
            raise  # another record's conflict: not the precondition's to answer
        if current is None:
            return _error(f"{_label(instance)} {instance.pk} was deleted while the request ran.", 412)
        return JsonResponse(
            conflict_body(changes_since(current, expected)), status=412 if decision.version is not None else 409
        )
    method = (request.method or "GET").upper()
    if 200 <= response.status_code < 300 and method != "DELETE" and not response.has_header("ETag"):
        response["ETag"] = etag_for(instance)
    return response


def conditional(
    queryset: models.QuerySet[Any] | type[models.Model] | Callable[[HttpRequest], models.QuerySet[Any]],
    *,
    lookup_field: str = "pk",
    lookup_url_kwarg: str | None = None,
    require_if_match: bool = False,
) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """Decorate a view of one record: ETag, If-None-Match and If-Match checked in the view's write.

    The record is looked up in ``queryset`` (a QuerySet, a model, or a callable taking the request, for
    a queryset per user) by ``lookup_field`` = the URL's ``lookup_url_kwarg`` (default: the same name),
    and passed to the view after the request: ``view(request, obj, *args, **kwargs)``. Write through
    ``obj.save()`` / ``obj.delete()``: they carry the client's version. ``require_if_match=True``
    answers 428 to a write without If-Match.
    """

    def decorator(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            def load() -> LockVersionMixin:
                rows: models.QuerySet[Any]
                if isinstance(queryset, type):
                    rows = cast("type[models.Model]", queryset)._default_manager.all()
                elif isinstance(queryset, models.QuerySet):
                    rows = queryset.all()  # a fresh copy: no result cache shared between requests
                else:
                    rows = queryset(request)
                try:
                    return rows.get(**{lookup_field: kwargs[lookup_url_kwarg or lookup_field]})  # type: ignore[return-value]
                except (ObjectDoesNotExist, ValueError, TypeError) as exc:
                    raise Http404(f"No {rows.model._meta.verbose_name} matches the given query.") from exc

            return respond(
                request, load, lambda obj: view(request, obj, *args, **kwargs), require_if_match=require_if_match
            )

        return wrapped

    return decorator


if TYPE_CHECKING:
    _SingleObjectMixin = SingleObjectMixin[Any]
else:
    _SingleObjectMixin = SingleObjectMixin  # generic only in django-stubs


class ConditionalMixin(_SingleObjectMixin, View):
    """The same for a class-based view with ``get_object()`` (``DetailView``, ``UpdateView``,
    ``DeleteView``, or ``View`` with ``model``): the object its handlers get from ``get_object()`` is
    loaded once, carries the client's version, and its ``save()`` / ``delete()`` is the check."""

    require_if_match = False
    _conditional_object: Any = None

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        def run(instance: LockVersionMixin) -> HttpResponseBase:
            self._conditional_object = instance
            return super(ConditionalMixin, self).dispatch(request, *args, **kwargs)

        try:
            return respond(request, super().get_object, run, require_if_match=self.require_if_match)
        finally:
            self._conditional_object = None

    def get_object(self, queryset: models.QuerySet[Any] | None = None) -> Any:
        if self._conditional_object is not None and queryset is None:
            return self._conditional_object
        return super().get_object(queryset)


def conflict_body(conflict: Conflict) -> dict[str, Any]:
    """The JSON body of a 409/412 from :func:`changes_since`: ``Conflict.as_dict()`` without the values
    seen (unknown), with a ``detail`` that says what was written since and what to do."""
    body = conflict.as_dict()
    for change in body["changes"]:
        del change["seen"]
    head = f"{conflict.label} {conflict.pk} was changed after the version you sent ({conflict.seen_version})"
    if conflict.changes:
        written = "; ".join(_describe(change) for change in conflict.changes)
        head = f"{head}: {written}"
    body["detail"] = f"{head}. Nothing was written: GET it again, then send your change with its new ETag."
    return body


def _describe(change: FieldChange) -> str:
    who = f"request {change.request_id}" if change.request_id else "a direct save"
    return f"{change.label} is now {change.now!r} ({who})"


def _label(instance: models.Model) -> str:
    return str(instance._meta.verbose_name).capitalize()


def _error(detail: str, status: int) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)
