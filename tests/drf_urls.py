"""A Django REST framework API of ``Profile``, for ``tests/test_drf.py`` (imported only with DRF)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import permissions, serializers, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.routers import SimpleRouter

from safeupdates.contrib.drf import ConditionalViewSetMixin, LockVersionSerializerMixin
from tests.testapp.models import Attachment, Document, Everything, Profile

#: Callables run between the view's read of the record and its write.
BETWEEN_READ_AND_WRITE: list[Callable[[], Any]] = []
#: Values ``NotingProfileViewSet`` sets itself on a create or an update (a server-computed note, a
#: score): fields its serializer does not show.
VIEW_SETS: dict[str, Any] = {}


class ProfileSerializer(LockVersionSerializerMixin, serializers.ModelSerializer):
    class Meta:
        model = Profile
        fields = ["id", "name", "active"]


class _ViewSet(ConditionalViewSetMixin, viewsets.ModelViewSet):
    """JSON, no authentication, and the hooks run between the read and the write."""

    renderer_classes = [JSONRenderer]
    parser_classes = [JSONParser]
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def perform_update(self, serializer):
        for hook in BETWEEN_READ_AND_WRITE:
            hook()
        super().perform_update(serializer)

    def perform_destroy(self, instance):
        for hook in BETWEEN_READ_AND_WRITE:
            hook()
        super().perform_destroy(instance)


class ProfileViewSet(_ViewSet):
    queryset = Profile.objects.all()
    serializer_class = ProfileSerializer


class StrictProfileViewSet(ProfileViewSet):
    require_if_match = True


class NotedProfileViewSet(ProfileViewSet):
    """Saves the new record itself, without calling the mixin's ``perform_create``."""

    def perform_create(self, serializer):
        serializer.save(note="set by the view")


class OwnerOnly(permissions.BasePermission):
    """Only the record's owner (here: the X-Owner header names it) may read or write it."""

    def has_object_permission(self, request, view, obj):
        return obj.name == request.headers.get("X-Owner")


class OwnedProfileViewSet(ProfileViewSet):
    """An object permission: DRF checks it in ``get_object()``, which the mixin's preconditions extend."""

    permission_classes = [OwnerOnly]


class LoggedInProfileViewSet(ProfileViewSet):
    """A view permission: DRF checks it before the handler; an anonymous client is refused (403)."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [permissions.IsAuthenticated]


class MineProfileViewSet(ProfileViewSet):
    """A queryset per client (as ``filter(user=request.user)``): the profile the X-Owner header names."""

    def get_queryset(self):
        return Profile.objects.filter(name=self.request.headers.get("X-Owner", ""))


def save_a_stale_document() -> None:
    """Save a copy of the one ``Document`` that another write made stale: a StaleObjectError not about
    the view's record."""
    other = Document.objects.get()
    Document.objects.filter(pk=other.pk).update(lock_version=other.lock_version + 1)
    other.title = "over"
    other.save()


class _SavesAnotherRecord(serializers.ModelSerializer):
    """Under the mixin in the bases (as a nested serializer's write would be): saves its record, then a
    stale copy of another record, inside the mixin's checked write."""

    def update(self, instance, validated_data):
        saved = super().update(instance, validated_data)
        save_a_stale_document()
        return saved


class WritesAnotherSerializer(LockVersionSerializerMixin, _SavesAnotherRecord):
    class Meta:
        model = Profile
        fields = ["id", "name", "active"]


class _DeletesThenWritesAnother:
    """Under the mixin in the bases: deletes the record, then saves a stale copy of another record,
    inside the mixin's checked delete."""

    def perform_destroy(self, instance):
        super().perform_destroy(instance)
        save_a_stale_document()


class WritesAnotherViewSet(ConditionalViewSetMixin, _DeletesThenWritesAnother, viewsets.ModelViewSet):
    """Writes (or deletes) its profile, then another record's save goes stale, within the mixin's write."""

    queryset = Profile.objects.all()
    serializer_class = WritesAnotherSerializer
    renderer_classes = [JSONRenderer]
    parser_classes = [JSONParser]
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []


class ThenWritesAnotherViewSet(ProfileViewSet):
    """Its own ``perform_update()`` saves the profile, then a stale copy of another record."""

    def perform_update(self, serializer):
        super().perform_update(serializer)
        save_a_stale_document()


class AttachmentSerializer(LockVersionSerializerMixin, serializers.ModelSerializer):
    spot = serializers.CharField()
    blob = serializers.CharField(required=False)

    class Meta:
        model = Attachment
        fields = ["id", "title", "file", "blob", "spot"]


class AttachmentViewSet(_ViewSet):
    queryset = Attachment.objects.all()
    serializer_class = AttachmentSerializer


class EverythingSerializer(LockVersionSerializerMixin, serializers.ModelSerializer):
    class Meta:
        model = Everything
        fields = ["id", "flag", "count", "big", "ratio", "name", "text", "slug", "email", "url", "data"]


class EverythingViewSet(_ViewSet):
    """Writes what a client's JSON body holds: a NaN, a lone surrogate, as ``json.loads`` makes them."""

    queryset = Everything.objects.all()
    serializer_class = EverythingSerializer


class NotingProfileViewSet(ProfileViewSet):
    """Saves values of its own (``VIEW_SETS``) in fields its serializer does not show."""

    def perform_create(self, serializer):
        serializer.save(**VIEW_SETS)

    def perform_update(self, serializer):
        serializer.save(**VIEW_SETS)


class SettingProfileViewSet(ProfileViewSet):
    """Sets values of its own (``VIEW_SETS``) on the record itself, then saves it through the serializer."""

    def perform_update(self, serializer):
        for name, value in VIEW_SETS.items():
            setattr(serializer.instance, name, value)
        super().perform_update(serializer)


router = SimpleRouter()
router.register("setting", SettingProfileViewSet, basename="setting-profile")
router.register("noting", NotingProfileViewSet, basename="noting-profile")
router.register("everything", EverythingViewSet, basename="everything")
router.register("profiles", ProfileViewSet, basename="profile")
router.register("strict", StrictProfileViewSet, basename="strict-profile")
router.register("noted", NotedProfileViewSet, basename="noted-profile")
router.register("attachments", AttachmentViewSet, basename="attachment")
router.register("owned", OwnedProfileViewSet, basename="owned-profile")
router.register("logged-in", LoggedInProfileViewSet, basename="logged-in-profile")
router.register("mine", MineProfileViewSet, basename="mine-profile")
router.register("writes-another", WritesAnotherViewSet, basename="writes-another-profile")
router.register("then-writes-another", ThenWritesAnotherViewSet, basename="then-writes-another-profile")
urlpatterns = router.urls
