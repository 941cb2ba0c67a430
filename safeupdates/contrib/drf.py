"""Django REST framework: ``lock_version`` in serializers, and the ETag rules of :mod:`safeupdates.http`
on viewsets. Needs the extra: ``pip install "django-safeupdates[drf]"``.

- :class:`LockVersionSerializerMixin` puts ``lock_version`` in the output and accepts it on input as the
  version the client saw: the update writes through the checked ``save()``, against that version. A
  PATCH is checked per field: it is refused (409 Conflict, naming only the fields both wrote) only if a
  field it writes was written after that version; a PUT, or any write with If-Match, per row (409/412
  with the serializer's fields whose values differ).
- :class:`ConditionalViewSetMixin` gives a detail route an ETag, 304 on ``If-None-Match``, and checks
  ``If-Match`` in the write (412 on a mismatch, 428 with ``require_if_match``), as the view decorator;
  a create answers the new record's ETag.

A conflict names only the serializer's fields (with their values: the serializer shows them), and the
preconditions are evaluated after DRF's permission checks (in ``get_object()``). A value the save refuses
(no column can hold it) is a 400 that names a field only if the serializer shows it, as that field's
error, and quotes no value the view set in another field (:mod:`safeupdates.refusals`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import router
from django.http import Http404, HttpRequest
from django.http.response import HttpResponseBase
from rest_framework import serializers
from rest_framework.exceptions import APIException, ErrorDetail, NotFound
from rest_framework.response import Response

from safeupdates.conflicts import changes_since, digests, find_field_conflict, reported_fields, written_since
from safeupdates.exceptions import InvalidUpdate, StaleObjectError
from safeupdates.http import MISSING, LostWrite, conflict_body, etag_for, evaluate, lost_write
from safeupdates.models import LockVersionMixin, NotedValues, checked_per_row, only_changes
from safeupdates.refusals import probe, told_refusal
from safeupdates.signals import refusals_on, stale_save_refused_robust

__all__ = [
    "ConditionalViewSetMixin",
    "ConflictError",
    "LockVersionSerializerMixin",
    "PreconditionFailedError",
    "serializer_fields",
]

#: The largest ``lock_version`` (a ``BigIntegerField``): a larger one is a 400, not a database error.
MAX_VERSION = 2**63 - 1


class ConflictError(APIException):  # type: ignore[misc]
    """409 Conflict: the record was written after the version the client sent in ``lock_version``."""

    status_code = 409
    default_code = "conflict"

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(detail=body["detail"])
        # As it is: DRF would turn every value of a dict detail into a string.
        self.detail = body


class PreconditionFailedError(ConflictError):
    """412 Precondition Failed: the record was written after the version the client's If-Match names."""

    status_code = 412
    default_code = "precondition_failed"


def serializer_fields(serializer: Any, model: type[Any]) -> list[str]:
    """The fields of ``model`` that ``serializer`` shows (by their ``source``): what a conflict may name."""
    return reported_fields(model, [f.source for f in serializer.fields.values() if not f.write_only])


def _api_error(answer: LostWrite) -> APIException:
    if answer.status == 404:
        return NotFound(answer.body["detail"])
    return (PreconditionFailedError if answer.status == 412 else ConflictError)(answer.body)


def _write(
    write: Callable[[], Any],
    instance: LockVersionMixin,
    *,
    precondition: bool,
    fields: list[str],
    seen: dict[str, str] | None,
    written: Callable[[], list[str]] | None = None,
) -> Any:
    """Run ``write()`` (the checked save or delete of ``instance``) and turn its lost race into a 409/412/404.

    ``written``: the save is checked per field, and writes (wrote) these fields: a 409 names only those
    of them written since, that the serializer shows.
    """
    loaded_version = instance.lock_version
    try:
        with refusals_on("drf"):  # the save signals its refusal, as this surface's
            return write()
    except StaleObjectError:
        answer = lost_write(instance, loaded_version, precondition=precondition, fields=fields, seen=seen, values=True)
        if answer is None:
            raise  # another record's conflict: the view's own
        if written is not None and answer.status == 409:
            current = type(instance)._base_manager.using(instance._state.db).filter(pk=instance.pk).first()
            if current is not None:
                conflict = _field_conflict(current, loaded_version, written(), fields, seen)
                if conflict is not None:
                    answer = LostWrite(409, conflict)
        raise _api_error(answer) from None
    except InvalidUpdate as exc:
        raise _refused(exc, type(instance), fields, instance) from None


def _field_conflict(
    current: LockVersionMixin, seen_version: int, written: list[str], fields: list[str], seen: dict[str, str] | None
) -> dict[str, Any] | None:
    """The 409 body of a write of the fields ``written`` checked per field against ``current`` (the row
    now), or None if none of them was written after ``seen_version``. It names only the fields among
    them written since that the serializer shows (``fields``): none, if only fields it does not show were."""
    if not written_since(current, seen_version, written):
        return None
    shown = [name for name in reported_fields(type(current), written) if name in fields]
    conflict = find_field_conflict(current, seen_version, seen or {}, shown) or changes_since(
        current, seen_version, [], values=True
    )
    return conflict_body(conflict)


class InvalidValueError(APIException):  # type: ignore[misc]
    """400: a value no column can hold (the save refused it before any statement: InvalidUpdate).

    For a field the serializer shows, the body is that field's error, as a serializer's own:
    ``{"name": ["..."]}``; for any other, ``{"detail": "..."}`` naming no field and quoting no value
    (:func:`safeupdates.refusals.told_refusal`; the server's log has the whole message).
    """

    status_code = 400
    default_code = "invalid"

    def __init__(self, detail: str, field: str | None = None) -> None:
        super().__init__(detail=detail)
        self.field = field
        if field is not None:
            self.detail = {field: [ErrorDetail(detail, code=self.default_code)]}


def _refused(exc: InvalidUpdate, model: type[Any], fields: list[str], instance: Any) -> InvalidValueError:
    told = told_refusal(exc, model, fields, surface="drf", instance=instance)
    return InvalidValueError(told.detail, told.field)


class LockVersionSerializerMixin(serializers.Serializer):  # type: ignore[misc]
    """``lock_version`` for a ``ModelSerializer`` of a ``LockVersionMixin`` model.

    In the output, the record's ``lock_version``. In the input of an update, the version the client
    saw. A PATCH (``partial=True``) that sends it, without If-Match, is checked per field: it writes the
    fields it changes (those the client sent, by their ``source``, and those ``perform_update()`` passes
    to ``serializer.save()`` or sets on the record), and is refused, 409 naming only the fields among
    them written after that version that the serializer shows, and writing nothing, if one of them was;
    two clients that change different fields both land. A PATCH that changes nothing writes nothing. A
    PUT, or a write with If-Match, is checked per row: any write since is a 409 (412 with If-Match)
    naming the serializer's fields whose values changed. It never sets ``lock_version``; a create
    ignores it. A version that is not a whole number from 0 to 2**63 - 1 is a 400. Put the mixin first:
    ``class ProfileSerializer(LockVersionSerializerMixin, serializers.ModelSerializer)``.
    """

    lock_version = serializers.IntegerField(min_value=0, max_value=MAX_VERSION, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The record as loaded, to tell the fields a view sets on it before the update (perform_update()):
        # only for a serializer given data for it (an update), not one that shows it.
        instance = self.instance
        self._safeupdates_loaded: tuple[Any, NotedValues] | None = (
            (instance, NotedValues(instance))
            if isinstance(instance, LockVersionMixin) and hasattr(self, "initial_data")
            else None
        )

    def get_field_names(self, declared_fields: Any, info: Any) -> Any:
        names = super().get_field_names(declared_fields, info)
        return names if "lock_version" in names else [*names, "lock_version"]

    def create(self, validated_data: dict[str, Any]) -> Any:
        validated_data.pop("lock_version", None)
        try:
            return super().create(validated_data)
        except InvalidUpdate as exc:
            model = self.Meta.model
            raise _refused(exc, model, serializer_fields(self, model), probe(model, validated_data)) from None

    def update(self, instance: Any, validated_data: dict[str, Any]) -> Any:
        seen_version = validated_data.pop("lock_version", None)
        header = self.context.get("if_match_version")
        if seen_version is not None and header is not None and seen_version != header:
            raise serializers.ValidationError(
                {"lock_version": [f"{seen_version} is not the version If-Match names ({header}); send one of them."]}
            )
        fields = serializer_fields(self, type(instance))
        loaded_version = instance.lock_version
        # What the client saw, where it is known: the record as loaded, if it sent the version loaded.
        seen = digests(instance, fields) if seen_version in (None, loaded_version) else None
        per_field = seen_version is not None and self.partial and header is None and not self._if_match_sent()
        written: Callable[[], list[str]] | None = None
        if per_field:
            set_before = self._set_since_loaded(instance)
            wanted = reported_fields(type(instance), [*validated_data, *set_before])
            self._refuse_written_since(instance, seen_version, wanted, fields)

            def written() -> list[str]:
                return reported_fields(type(instance), [*wanted, *self._set_since_loaded(instance)])

            # ModelSerializer.update()'s plain save() writes those fields whose value it changes, and
            # those set before it: checked per field, against the version the client saw.
            only_changes(instance, set_before)
        if seen_version is not None:
            instance.lock_version = seen_version
        saved = _write(
            lambda: super(LockVersionSerializerMixin, self).update(instance, validated_data),
            instance,
            precondition=header is not None,
            fields=fields,
            seen=seen,
            written=written,
        )
        if per_field:
            _show_as_stored(instance, loaded_version, seen_version)
        return saved

    def _if_match_sent(self) -> bool:
        request = self.context.get("request")
        return request is not None and request.headers.get("If-Match") is not None

    def _set_since_loaded(self, instance: Any) -> list[str]:
        """The fields set on ``instance`` since this serializer was given it (by a ``perform_update()``)."""
        if self._safeupdates_loaded is None or self._safeupdates_loaded[0] is not instance:
            return []
        return self._safeupdates_loaded[1].set_since(instance)

    def _refuse_written_since(self, instance: Any, seen_version: int, wanted: list[str], fields: list[str]) -> None:
        """409, before anything is written, if one of the fields ``wanted`` was written after ``seen_version``
        (the record as loaded knows: a write since it was loaded is refused by the save itself)."""
        body = _field_conflict(instance, seen_version, wanted, fields, None)
        if body is None:
            return
        stale_save_refused_robust(
            type(instance),
            pk=instance.pk,
            version=seen_version,
            fields=wanted,
            surface="drf",
            using=instance._state.db or router.db_for_write(type(instance), instance=instance),
        )
        raise ConflictError(body)


def _show_as_stored(instance: Any, loaded_version: int, seen_version: int) -> None:
    """After a PATCH checked per field: the record as the row holds it, for the response and its ETag.

    A PATCH that wrote nothing keeps the version loaded (not the older one the client sent). One that
    wrote over another client's write of other fields (since the record was loaded) holds an older
    read of those: read the row again.
    """
    if instance.lock_version == seen_version:  # nothing written: a write takes a fresh version
        instance.lock_version = loaded_version
        return
    if any(
        loaded_version < instance.field_version(name) < instance.lock_version
        for name in reported_fields(type(instance))
    ):
        instance.refresh_from_db()


class _Answer(Exception):
    """A response decided by the preconditions, before the handler runs."""

    def __init__(self, response: HttpResponseBase) -> None:
        super().__init__(response.status_code)
        self.response = response


class ConditionalViewSetMixin:
    """ETag, If-None-Match and If-Match on the detail routes of a ``GenericAPIView`` / ``ViewSet``; the
    ETag of the saved record on a create and an update.

    ``get_object()`` evaluates the preconditions, after DRF's own permission checks, and returns the
    record carrying the version If-Match names, so the update's (or the destroy's) checked write is the
    check: a row written since is answered 412 (409 without If-Match: it changed while the request ran).
    ``require_if_match = True`` answers 428 to a write without If-Match. The ETag carries a digest of
    each of the serializer's fields, so that a 412 lists only those whose value differs.
    """

    require_if_match = False
    _if_match_version: int | None = None
    _conditional_object: Any = None
    _serializer: Any = None
    _conflict_fields: list[str] | None = None
    request: Any

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # A refusal in this request (an If-Match naming an older version, a lost write) is the API's.
        with refusals_on("drf"):
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]

    def get_object(self) -> Any:
        try:
            instance = super().get_object()  # type: ignore[misc]
        except Http404:
            if self.request.headers.get("If-Match") is not None:
                raise _Answer(Response({"detail": MISSING}, 412)) from None
            raise
        fields = self._fields(type(instance))
        decision = evaluate(
            self._django_request(), instance, require_if_match=self.require_if_match, conflict_fields=fields
        )
        if decision.response is not None:
            raise _Answer(decision.response)
        if decision.version is not None:
            instance.lock_version = self._if_match_version = decision.version
            checked_per_row(instance)  # an ETag names the whole row: strict, whatever fields the write names
        self._conditional_object = instance
        return instance

    def _fields(self, model: type[Any]) -> list[str]:
        """The serializer's fields: what the ETag digests and a conflict names (once per request)."""
        if self._conflict_fields is None:
            serializer = self.get_serializer_class()(context=self.get_serializer_context())  # type: ignore[attr-defined]
            self._conflict_fields = serializer_fields(serializer, model)
        return self._conflict_fields

    def _django_request(self) -> HttpRequest:
        request = self.request._request
        request.method = self.request.method  # DRF may override the method (X-HTTP-Method-Override)
        return request  # type: ignore[no-any-return]

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        # The record a create or an update saved is the serializer's: its ETag is the response's,
        # whatever perform_create() or perform_update() does to save it.
        self._serializer = super().get_serializer(*args, **kwargs)  # type: ignore[misc]
        return self._serializer

    def get_serializer_context(self) -> dict[str, Any]:
        context: dict[str, Any] = super().get_serializer_context()  # type: ignore[misc]
        context["if_match_version"] = self._if_match_version
        return context

    def perform_destroy(self, instance: Any) -> None:
        fields = self._fields(type(instance))
        _write(
            lambda: super(ConditionalViewSetMixin, self).perform_destroy(instance),  # type: ignore[misc]
            instance,
            precondition=self._if_match_version is not None,
            fields=fields,
            seen=digests(instance, fields),
        )

    def handle_exception(self, exc: Exception) -> Any:
        if isinstance(exc, _Answer):
            return exc.response
        return super().handle_exception(exc)  # type: ignore[misc]

    def finalize_response(self, request: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        saved = getattr(self._serializer, "instance", None)
        instance = saved if isinstance(saved, LockVersionMixin) else self._conditional_object
        if (
            instance is not None
            and instance.pk is not None
            and 200 <= response.status_code < 300
            and request.method != "DELETE"
            and not response.has_header("ETag")
        ):
            response["ETag"] = etag_for(instance, self._fields(type(instance)))
        self._conditional_object = self._if_match_version = self._serializer = self._conflict_fields = None
        return response
