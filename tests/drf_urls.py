"""A Django REST framework API of ``Profile``, for ``tests/test_drf.py`` (imported only with DRF)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers, viewsets
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.routers import SimpleRouter

from safeupdates.contrib.drf import ConditionalViewSetMixin, LockVersionSerializerMixin
from tests.testapp.models import Attachment, Profile

#: Callables run between the view's read of the record and its write.
BETWEEN_READ_AND_WRITE: list[Callable[[], Any]] = []


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


class AttachmentSerializer(LockVersionSerializerMixin, serializers.ModelSerializer):
    spot = serializers.CharField()
    blob = serializers.CharField(required=False)

    class Meta:
        model = Attachment
        fields = ["id", "title", "file", "blob", "spot"]


class AttachmentViewSet(_ViewSet):
    queryset = Attachment.objects.all()
    serializer_class = AttachmentSerializer


router = SimpleRouter()
router.register("profiles", ProfileViewSet, basename="profile")
router.register("strict", StrictProfileViewSet, basename="strict-profile")
router.register("noted", NotedProfileViewSet, basename="noted-profile")
router.register("attachments", AttachmentViewSet, basename="attachment")
urlpatterns = router.urls
