"""Django REST framework: ``lock_version`` in serializers, and the ETag rules of :mod:`safeupdates.http`
on viewsets. Needs the extra: ``pip install "django-safeupdates[drf]"``.

- :class:`LockVersionSerializerMixin` puts ``lock_version`` in the output and accepts it on input as the
  version the client saw: the update writes through the checked ``save()``, against that version, and a
  stale one is answered 409 Conflict with the fields written since.
- :class:`ConditionalViewSetMixin` gives a detail route an ETag, 304 on ``If-None-Match``, and checks
  ``If-Match`` in the write (412 on a mismatch, 428 with ``require_if_match``), as the view decorator;
  a create answers the new record's ETag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import Http404, HttpRequest
from django.http.response import HttpResponseBase
from rest_framework import serializers
from rest_framework.exceptions import APIException
from rest_framework.response import Response

from safeupdates.exceptions import StaleObjectError
from safeupdates.http import changes_since, conflict_body, etag_for, evaluate

if TYPE_CHECKING:
    from safeupdates.models import LockVersionMixin

__all__ = ["ConditionalViewSetMixin", "ConflictError", "LockVersionSerializerMixin", "PreconditionFailedError"]


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


def _stale(instance: LockVersionMixin, expected: int, error: type[ConflictError]) -> ConflictError | None:
    """The error for a lost write of ``instance`` at ``expected``; None if its row did not move (the
    ``StaleObjectError`` was another record's)."""
    current = type(instance)._base_manager.using(instance._state.db).filter(pk=instance.pk).first()
    if current is None:
        label = str(instance._meta.verbose_name).capitalize()
        return error({"detail": f"{label} {instance.pk} was deleted; nothing was written.", "changes": []})
    if current.lock_version == expected:
        return None
    return error(conflict_body(changes_since(current, expected)))


class LockVersionSerializerMixin(serializers.Serializer):  # type: ignore[misc]
    """``lock_version`` for a ``ModelSerializer`` of a ``LockVersionMixin`` model.

    In the output, the record's ``lock_version``. In the input of an update, the version the client
    saw: the update is written only if the row still carries it (the checked ``save()``), else 409
    with the fields written since. It never sets ``lock_version``; a create ignores it. Put the mixin
    first: ``class ProfileSerializer(LockVersionSerializerMixin, serializers.ModelSerializer)``.
    """

    lock_version = serializers.IntegerField(min_value=0, required=False)

    def get_field_names(self, declared_fields: Any, info: Any) -> Any:
        names = super().get_field_names(declared_fields, info)
        return names if "lock_version" in names else [*names, "lock_version"]

    def create(self, validated_data: dict[str, Any]) -> Any:
        validated_data.pop("lock_version", None)
        return super().create(validated_data)

    def update(self, instance: Any, validated_data: dict[str, Any]) -> Any:
        seen = validated_data.pop("lock_version", None)
        header = self.context.get("if_match_version")
        if seen is not None and header is not None and seen != header:
            raise serializers.ValidationError(
                {"lock_version": [f"{seen} is not the version If-Match names ({header}); send one of them."]}
            )
        if seen is not None:
            instance.lock_version = seen
        expected = instance.lock_version
        try:
            return super().update(instance, validated_data)
        except StaleObjectError:
            error = _stale(instance, expected, PreconditionFailedError if header is not None else ConflictError)
            if error is None:
                raise
            raise error from None


class _Answer(Exception):
    """A response decided by the preconditions, before the handler runs."""

    def __init__(self, response: HttpResponseBase) -> None:
        super().__init__(response.status_code)
        self.response = response


class ConditionalViewSetMixin:
    """ETag, If-None-Match and If-Match on the detail routes of a ``GenericAPIView`` / ``ViewSet``; the
    ETag of the new record on a create.

    ``get_object()`` evaluates the preconditions and returns the record carrying the version If-Match
    names, so the update's (or the destroy's) checked write is the check: a row written since is
    answered 412 (409 without If-Match: it changed while the request ran). ``require_if_match = True``
    answers 428 to a write without If-Match.
    """

    require_if_match = False
    _if_match_version: int | None = None
    _conditional_object: Any = None
    request: Any

    def get_object(self) -> Any:
        try:
            instance = super().get_object()  # type: ignore[misc]
        except Http404:
            if self.request.headers.get("If-Match") is not None:
                raise _Answer(
                    Response({"detail": "If-Match: the record does not exist (any more); nothing was written."}, 412)
                ) from None
            raise
        decision = evaluate(self._django_request(), instance, require_if_match=self.require_if_match)
        if decision.response is not None:
            raise _Answer(decision.response)
        if decision.version is not None:
            instance.lock_version = self._if_match_version = decision.version
        self._conditional_object = instance
        return instance

    def _django_request(self) -> HttpRequest:
        request = self.request._request
        request.method = self.request.method  # DRF may override the method (X-HTTP-Method-Override)
        return request  # type: ignore[no-any-return]

    def get_serializer_context(self) -> dict[str, Any]:
        context: dict[str, Any] = super().get_serializer_context()  # type: ignore[misc]
        context["if_match_version"] = self._if_match_version
        return context

    def perform_create(self, serializer: Any) -> None:
        super().perform_create(serializer)  # type: ignore[misc]
        # The 201 carries the new record's ETag: the client's next write can send If-Match at once.
        self._conditional_object = serializer.instance

    def perform_destroy(self, instance: Any) -> None:
        expected = instance.lock_version
        try:
            super().perform_destroy(instance)  # type: ignore[misc]
        except StaleObjectError:
            error = _stale(
                instance, expected, PreconditionFailedError if self._if_match_version is not None else ConflictError
            )
            if error is None:
                raise
            raise error from None

    def handle_exception(self, exc: Exception) -> Any:
        if isinstance(exc, _Answer):
            return exc.response
        return super().handle_exception(exc)  # type: ignore[misc]

    def finalize_response(self, request: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        instance = self._conditional_object
        if (
            instance is not None
            and 200 <= response.status_code < 300
            and request.method != "DELETE"
            and not response.has_header("ETag")
        ):
            response["ETag"] = etag_for(instance)
        self._conditional_object = self._if_match_version = None
        return response
