"""Conditional requests on a record: ``lock_version`` as its ETag, and ``If-Match`` checked in the write.

A GET (or HEAD) answers with a strong ETag of the record; ``If-None-Match`` gives 304 Not Modified. A
PUT, PATCH, POST or DELETE that sends ``If-Match`` writes only if the row still carries the version that
ETag names, and the check is the write itself: the view gets the record with ``lock_version`` set to
the client's version, so its ``save()`` (or ``delete()``) runs ``UPDATE ... WHERE lock_version =
<client's>``. A row changed by anyone after the client read it -- also between this view's read and its
write -- makes that statement match nothing: ``StaleObjectError``, answered 412 Precondition Failed
(409 Conflict without If-Match); under ``ATOMIC_REQUESTS`` nothing else the view wrote is kept either.
Django's ``condition()`` compares first and writes later, and a write that lands in between is
silently overwritten.

The ETag is ``"<lock_version>[.<digests>].<signature>"``: the version, so that the write can carry it
and the 412 can say what changed since; for each of the view's ``conflict_fields``, a keyed digest of
its value (never the value: :func:`safeupdates.conflicts.field_digest`), so that the 412 lists only the
fields whose value differs from the one the client saw; signed with the model, the primary key and
``SECRET_KEY``, so that one record's ETag is never valid for another (rows migrated in all share
``lock_version`` 0) and a client cannot make one up.

A 409/412 body names only fields the view shows: its ``conflict_fields``, with their values now; a view
that declares none gets the names of the fields changed, without values. The preconditions are
evaluated after the view's own permission checks (a ``permission`` of the decorator, the class-based
view's dispatch and ``has_object_permission()``): a client who may not read the record gets the answer
of a record that does not exist, whatever it sends. A value the view's save refuses (no column can hold
it) is a 400 that names the field only if it is one of ``conflict_fields``, and quotes no value of any
other field (:mod:`safeupdates.refusals`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import wraps
from typing import TYPE_CHECKING, Any, Literal, cast

from django.core import signing
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import DEFAULT_DB_ALIAS, models, transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotModified, JsonResponse
from django.http.response import HttpResponseBase
from django.utils.crypto import constant_time_compare
from django.utils.text import Truncator
from django.views.generic import View
from django.views.generic.detail import SingleObjectMixin

from safeupdates.conflicts import (
    DIGEST_LENGTH,
    Conflict,
    FieldChange,
    changes_since,
    digests,
    field_digest,
    reported_fields,
    shown_text,
)
from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from safeupdates.models import checked_per_row
from safeupdates.refusals import told_refusal
from safeupdates.signals import refusals_on, stale_save_refused_robust

if TYPE_CHECKING:
    from safeupdates.models import LockVersionMixin

__all__ = [
    "ANY",
    "ConditionalMixin",
    "Decision",
    "LostWrite",
    "MalformedHeader",
    "conditional",
    "conflict_body",
    "etag_for",
    "evaluate",
    "lost_write",
    "parse_etags",
    "read_etag",
    "respond",
    "version_from_etag",
]

_SALT = "safeupdates.etag"
#: Methods that read; every other method writes (and If-Match is checked in its write).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
#: What an answer about a record that does not exist (or that the client may not read) says.
MISSING = "If-Match: the record does not exist (any more); nothing was written."

ANY: Literal["*"] = "*"
# entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE ; etagc = %x21 / %x23-7E / obs-text  (RFC 9110, 8.8.3)
_ENTITY_TAG = re.compile(r'[ \t]*(W/)?"([\x21\x23-\x7e\x80-\xff]*)"[ \t]*(?:,|$)')
_EMPTY_ELEMENT = re.compile(r"[ \t]*,")
_DIGESTS = re.compile(r"[A-Za-z0-9_-]*")


class MalformedHeader(ValueError):
    """An If-Match or If-None-Match header that is not ``*`` nor a list of entity tags."""


def etag_for(instance: LockVersionMixin, conflict_fields: Sequence[str] = ()) -> str:
    """The strong, quoted ETag of ``instance`` as loaded: its ``lock_version`` and a digest of each of
    ``conflict_fields`` (none by default), signed for this record."""
    names = reported_fields(type(instance), conflict_fields)
    seen = "".join(field_digest(instance, name) for name in names)
    body = f"{instance.lock_version}.{seen}" if seen else str(instance.lock_version)
    return f'"{body}.{_signature(instance, body, None)}"'


def read_etag(opaque: str, instance: LockVersionMixin) -> tuple[int, str] | None:
    """The ``(lock_version, digests)`` an ETag (without its quotes) carries, if it was made for
    ``instance``'s record; None for an ETag of another record, of another ``SECRET_KEY`` (keys in
    ``SECRET_KEY_FALLBACKS`` are accepted, as by :mod:`django.core.signing`), or not one of ours."""
    body, dot, signature = opaque.rpartition(".")
    version_text, _, seen = body.partition(".")
    if not dot or not version_text.isascii() or not version_text.isdigit() or len(version_text) > 19:
        return None
    if len(seen) % DIGEST_LENGTH or not _DIGESTS.fullmatch(seen):
        return None
    signer = signing.Signer(salt=_SALT)
    for key in (signer.key, *signer.fallback_keys):
        if constant_time_compare(signature, _signature(instance, body, key)):
            return int(version_text), seen
    return None


def version_from_etag(opaque: str, instance: LockVersionMixin) -> int | None:
    """The ``lock_version`` an ETag (without its quotes) names, if it was made for ``instance``'s record
    (:func:`read_etag`)."""
    read = read_etag(opaque, instance)
    return None if read is None else read[0]


def _signature(instance: models.Model, body: str, key: Any) -> str:
    # The concrete model: a proxy (or a parent of multi-table inheritance) names the same row.
    label = (instance._meta.concrete_model or type(instance))._meta.label_lower
    return signing.Signer(salt=_SALT).signature(f"{label}:{instance.pk}:{body}", key=key)


def _seen(seen: str, names: Sequence[str]) -> dict[str, str] | None:
    """The digests of an ETag by field name; None if they are not those of ``names`` (an ETag of a
    view that shows other fields, or of none)."""
    if not names or len(seen) != DIGEST_LENGTH * len(names):
        return None
    return {name: seen[i * DIGEST_LENGTH : (i + 1) * DIGEST_LENGTH] for i, name in enumerate(names)}


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
    return repr(Truncator(text).chars(63, "..."))


@dataclass(frozen=True)
class Decision:
    """What the preconditions of a request decide: answer now (``response``) or let the view run.

    When the view runs, ``version`` is the ``lock_version`` its write must find on the row: the one the
    client's If-Match names (None without If-Match, or with ``If-Match: *``: the version loaded).
    """

    response: HttpResponse | None = None
    version: int | None = None


def evaluate(
    request: HttpRequest,
    instance: LockVersionMixin,
    *,
    require_if_match: bool = False,
    conflict_fields: Sequence[str] | None = None,
) -> Decision:
    """Evaluate If-Match and If-None-Match against ``instance`` (as loaded), in RFC 9110's order (13.2.2).

    400 for a malformed header; 428 for a write without If-Match when ``require_if_match``; 412 when
    If-Match names no ETag of this record, names an older version (the body lists the fields among
    ``conflict_fields`` whose value differs from the one the ETag saw, with their values; without
    ``conflict_fields``, the names of the fields written since), or when If-None-Match matches on a
    write; 304 when If-None-Match matches on a GET or HEAD. Evaluate it after the view's permission
    checks: a 412 tells what changed. A 412 for an older version sends ``stale_save_refused`` (surface
    ``"http"``).
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
            etags = [read for weak, opaque in tags if not weak and (read := read_etag(opaque, instance)) is not None]
            if not etags:
                return Decision(
                    _error(
                        f"If-Match names no current ETag of {_label(instance)} {instance.pk} (a weak ETag, "
                        "one of another record, or not one of ours). GET it and send the ETag it answers with.",
                        412,
                    )
                )
            if instance.lock_version not in [seen_version for seen_version, _seen_digests in etags]:
                # Refusing early is safe (no write happens); accepting is decided by the write itself.
                seen_version, seen = max(etags)
                stale_save_refused_robust(
                    type(instance),
                    pk=instance.pk,
                    version=seen_version,
                    fields=(),  # the request's, not known before the view runs
                    surface="http",
                    using=instance._state.db or DEFAULT_DB_ALIAS,
                )
                names = reported_fields(type(instance), conflict_fields)
                conflict = changes_since(
                    instance, seen_version, names, seen=_seen(seen, names), values=conflict_fields is not None
                )
                return Decision(JsonResponse(conflict_body(conflict), status=412))
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
                not_modified["ETag"] = etag_for(instance, conflict_fields or ())
                return Decision(not_modified)
            return Decision(_error("If-None-Match matches the current ETag: nothing was written.", 412))
    return Decision(version=version)


@dataclass(frozen=True)
class LostWrite:
    """The answer to a write of the record the preconditions were about that lost to another write."""

    status: int
    body: dict[str, Any]


def lost_write(
    instance: LockVersionMixin,
    loaded_version: int,
    *,
    precondition: bool,
    fields: Sequence[str],
    seen: dict[str, str] | None,
    values: bool,
) -> LostWrite | None:
    """The answer to a ``StaleObjectError`` raised while a view wrote ``instance``, loaded at
    ``loaded_version`` (with ``seen`` the digests of ``fields`` as loaded); None if it is not about
    ``instance`` (the view saved it, or its row did not move): another record's conflict is the view's.

    412 if the client sent a version (If-Match), else 409; the body lists the fields among ``fields``
    whose value differs from the one loaded. A row deleted meanwhile is 412 with If-Match, else 404:
    no precondition was sent, and the record is not found, as a moment later.
    """
    if instance.pk is None or instance.lock_version != loaded_version:
        return None  # deleted or saved by the view: the error came from another record
    current = type(instance)._base_manager.using(instance._state.db).filter(pk=instance.pk).first()
    if current is None:
        detail = f"{_label(instance)} {instance.pk} was deleted while the request ran; nothing was written."
        return LostWrite(412 if precondition else 404, {"detail": detail})
    if current.lock_version == loaded_version:
        return None
    conflict = changes_since(current, loaded_version, fields, seen=seen, values=values)
    return LostWrite(412 if precondition else 409, conflict_body(conflict))


class _Answer(Exception):
    """A response decided before the view's write: the preconditions, or a record not found."""

    def __init__(self, response: HttpResponseBase) -> None:
        super().__init__(response.status_code)
        self.response = response


@dataclass(frozen=True)
class _Loaded:
    """The record a request's preconditions were about, as loaded, and what a conflict may report."""

    instance: LockVersionMixin
    version: int
    precondition: bool
    fields: list[str]
    conflict_fields: Sequence[str] | None
    seen: dict[str, str]

    def lost_write(self) -> JsonResponse | None:
        answer = lost_write(
            self.instance,
            self.version,
            precondition=self.precondition,
            fields=self.fields,
            seen=self.seen,
            values=self.conflict_fields is not None,
        )
        if answer is None:
            return None
        _discard_the_requests_writes(self.instance)
        return JsonResponse(answer.body, status=answer.status)

    def refused_value(self, exc: InvalidUpdate) -> JsonResponse:
        """A value the view wrote that no column can hold (a client's NaN, a lone surrogate of its JSON,
        a value the view computed): 400, not a server error, and under ``ATOMIC_REQUESTS`` what else the
        view wrote is rolled back. The save refused it before any statement, so the request's transaction
        is not broken. The body names the field only if it is one of ``conflict_fields`` (the fields the
        view shows), and quotes no other value (:func:`safeupdates.refusals.told_refusal`)."""
        _discard_the_requests_writes(self.instance)
        told = told_refusal(exc, type(self.instance), self.conflict_fields, surface="http", instance=self.instance)
        body: dict[str, Any] = {"detail": told.detail}
        if told.field is not None:
            body["field"] = told.field
        return JsonResponse(body, status=400)

    def with_etag(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        method = (request.method or "GET").upper()
        deleted = method == "DELETE" or self.instance.pk is None
        if 200 <= response.status_code < 300 and not deleted and not response.has_header("ETag"):
            response["ETag"] = etag_for(self.instance, self.conflict_fields or ())
        return response


def _checked(
    request: HttpRequest,
    load: Callable[[], LockVersionMixin],
    permission: Callable[[HttpRequest, Any], bool] | None,
    *,
    require_if_match: bool,
    conflict_fields: Sequence[str] | None,
) -> _Loaded:
    """Load the record, check the permission, then the preconditions; raise :class:`_Answer` with the
    response when they decide. A record the client may not read is answered as one that does not exist."""
    try:
        instance = load()
        if permission is not None and not permission(request, instance):
            raise Http404(f"No {instance._meta.verbose_name} matches the given query.")
    except (ObjectDoesNotExist, Http404):
        if request.headers.get("If-Match") is not None:
            raise _Answer(_error(MISSING, 412)) from None
        raise
    decision = evaluate(request, instance, require_if_match=require_if_match, conflict_fields=conflict_fields)
    if decision.response is not None:
        raise _Answer(decision.response)
    fields = reported_fields(type(instance), conflict_fields)
    if decision.version is not None:
        checked_per_row(instance)  # an ETag names the whole row: strict, whatever fields the view saves
    # What the client saw: the version its If-Match names is the one loaded (or, without, the view loaded it).
    return _Loaded(
        instance,
        instance.lock_version,
        decision.version is not None,
        fields,
        conflict_fields,
        digests(instance, fields),
    )


def _discard_the_requests_writes(instance: models.Model) -> None:
    """Under ``ATOMIC_REQUESTS``, roll back what the view wrote before its write was refused, as Django
    REST framework does for its errors: a 412 means the method was not applied (RFC 9110, 15.5.13)."""
    using = instance._state.db or DEFAULT_DB_ALIAS
    connection = transaction.get_connection(using)
    if connection.settings_dict.get("ATOMIC_REQUESTS") and connection.in_atomic_block:
        transaction.set_rollback(True, using=using)


def respond(
    request: HttpRequest,
    load: Callable[[], LockVersionMixin],
    view: Callable[[LockVersionMixin], HttpResponseBase],
    *,
    require_if_match: bool = False,
    conflict_fields: Sequence[str] | None = None,
    permission: Callable[[HttpRequest, Any], bool] | None = None,
) -> HttpResponseBase:
    """Load the record, check ``permission`` and the preconditions, run ``view`` with it, and map a lost
    write of that record to 412/409.

    The record ``view`` receives carries the client's version as ``lock_version``: its ``save()`` and
    ``delete()`` are the check. A ``StaleObjectError`` of that record is answered 412 when the client
    sent a version (If-Match) and 409 when it did not (the row changed while the request ran), and under
    ``ATOMIC_REQUESTS`` what else the view wrote is rolled back; one of another record (the view saved
    this one, or its row did not move) is the view's own, and propagates.
    """
    with refusals_on("http"):  # a write the view's save refuses is signalled once, as this surface's
        try:
            loaded = _checked(
                request, load, permission, require_if_match=require_if_match, conflict_fields=conflict_fields
            )
        except _Answer as answer:
            return answer.response
        try:
            response = view(loaded.instance)
        except StaleObjectError:
            lost = loaded.lost_write()
            if lost is None:
                raise
            return lost
        except InvalidUpdate as exc:
            return loaded.refused_value(exc)
    return loaded.with_etag(request, response)


def conditional(
    queryset: models.QuerySet[Any] | type[models.Model] | Callable[[HttpRequest], models.QuerySet[Any]],
    *,
    lookup_field: str = "pk",
    lookup_url_kwarg: str | None = None,
    require_if_match: bool = False,
    conflict_fields: Sequence[str] | None = None,
    permission: Callable[[HttpRequest, Any], bool] | None = None,
) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """Decorate a view of one record: ETag, If-None-Match and If-Match checked in the view's write.

    The record is looked up in ``queryset`` (a QuerySet, a model, or a callable taking the request, for
    a queryset per user) by ``lookup_field`` = the URL's ``lookup_url_kwarg`` (default: the same name),
    and passed to the view after the request: ``view(request, obj, *args, **kwargs)``. Write through
    ``obj.save()`` / ``obj.delete()``: they carry the client's version. ``require_if_match=True``
    answers 428 to a write without If-Match. ``conflict_fields``: the fields the view shows, which a
    409/412 may list with their values (default: names only). ``permission(request, obj)``: False
    answers as for a record that does not exist, before any precondition is looked at. A queryset
    that cannot be built or searched for the request (an anonymous user in ``filter(user=request.user)``,
    a malformed key) is a 404, as in Django REST framework's ``get_object_or_404``.
    """

    def decorator(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            def load() -> LockVersionMixin:
                rows: models.QuerySet[Any]
                try:
                    if isinstance(queryset, type):
                        rows = cast("type[models.Model]", queryset)._default_manager.all()
                    elif isinstance(queryset, models.QuerySet):
                        rows = queryset.all()  # a fresh copy: no result cache shared between requests
                    else:
                        rows = queryset(request)
                    return cast(
                        "LockVersionMixin", rows.get(**{lookup_field: kwargs[lookup_url_kwarg or lookup_field]})
                    )
                except (ObjectDoesNotExist, ValidationError, ValueError, TypeError) as exc:
                    raise Http404("No record matches the given query.") from exc

            return respond(
                request,
                load,
                lambda obj: view(request, obj, *args, **kwargs),
                require_if_match=require_if_match,
                conflict_fields=conflict_fields,
                permission=permission,
            )

        return wrapped

    return decorator


if TYPE_CHECKING:
    _SingleObjectMixin = SingleObjectMixin[Any]
else:
    _SingleObjectMixin = SingleObjectMixin  # generic only in django-stubs


class ConditionalMixin(_SingleObjectMixin, View):
    """The same for a class-based view with ``get_object()`` (``DetailView``, ``UpdateView``,
    ``DeleteView``, or ``View`` with ``model``): the first ``get_object()`` of a handler loads the
    record, checks :meth:`has_object_permission` and the preconditions, and returns the record carrying
    the client's version, whose ``save()`` / ``delete()`` is the check.

    The preconditions are evaluated there, not in ``dispatch()``: the checks of the view's other
    mixins (``LoginRequiredMixin``, ``PermissionRequiredMixin``), wherever they stand in the bases, run
    first. ``conflict_fields``: the fields the view shows, as for :func:`conditional`.
    """

    require_if_match = False
    conflict_fields: Sequence[str] | None = None
    _conditional: _Loaded | None = None

    def has_object_permission(self, request: HttpRequest, obj: Any) -> bool:
        """Whether the client may read ``obj``: False answers as for a record that does not exist."""
        return True

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        self._conditional = None
        try:
            with refusals_on("http"):
                response = super().dispatch(request, *args, **kwargs)
        except _Answer as answer:
            return answer.response
        except StaleObjectError:
            lost = self._conditional.lost_write() if self._conditional is not None else None
            if lost is None:
                raise
            return lost
        except InvalidUpdate as exc:
            if self._conditional is None:
                raise
            return self._conditional.refused_value(exc)
        finally:
            loaded, self._conditional = self._conditional, None
        return response if loaded is None else loaded.with_etag(request, response)

    def get_object(self, queryset: models.QuerySet[Any] | None = None) -> Any:
        if queryset is not None:
            return super().get_object(queryset)
        if self._conditional is None:
            self._conditional = _checked(
                self.request,
                super().get_object,
                lambda request, obj: self.has_object_permission(request, obj),
                require_if_match=self.require_if_match,
                conflict_fields=self.conflict_fields,
            )
        return self._conditional.instance


def conflict_body(conflict: Conflict) -> dict[str, Any]:
    """The JSON body of a 409/412: ``Conflict.as_dict()``, with a ``detail`` that says what was written
    since and what to do."""
    body = conflict.as_dict()
    head = f"{conflict.label} {conflict.pk} was changed after the version you sent ({conflict.seen_version})"
    if conflict.changes:
        written = "; ".join(_describe(change) for change in conflict.changes)
        head = f"{head}: {written}"
    body["detail"] = f"{head}. Nothing was written: GET it again, then send your change with its new ETag."
    return body


def _describe(change: FieldChange) -> str:
    if not change.shows_now:
        return f"{change.label} changed ({change.writer})"
    return f"{change.label} is now {shown_text(change.field, change.now)} ({change.writer})"


def _label(instance: models.Model) -> str:
    return str(instance._meta.verbose_name).capitalize()


def _error(detail: str, status: int) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)
