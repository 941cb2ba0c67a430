"""A user-facing UpdateView with SafeUpdateModelForm, for the tests of the form through real HTTP."""

from __future__ import annotations

from django.http import HttpResponse
from django.template import engines
from django.urls import path
from django.views.generic import UpdateView

from safeupdates.forms import SafeUpdateModelForm, SafeUpdateViewMixin
from safeupdates.versions import next_version
from tests.testapp.models import Profile

_PAGE = engines["django"].from_string('<form method="post" id="profile">{{ form.as_div }}<button>Save</button></form>')


class ProfileForm(SafeUpdateModelForm):
    class Meta:
        model = Profile
        fields = ["name", "active", "score"]


class ProfileUpdate(SafeUpdateViewMixin, UpdateView):  # type: ignore[type-arg]
    model = Profile
    form_class = ProfileForm
    success_url = "/done/"

    def get_template_names(self) -> list[str]:
        return []

    def render_to_response(self, context: dict, **kwargs: object) -> HttpResponse:  # type: ignore[type-arg]
        return HttpResponse(_PAGE.render(context, self.request))


class RacedProfileUpdate(ProfileUpdate):
    """A worker applies a request after the form's check, before its save."""

    def form_valid(self, form: ProfileForm) -> HttpResponse:
        Profile.objects.update_if_newer(form.instance.pk, version=next_version(), active=True)
        return super().form_valid(form)


class RacedNameProfileUpdate(ProfileUpdate):
    """Someone else renames the record after the form's check, before its save."""

    def form_valid(self, form: ProfileForm) -> HttpResponse:
        Profile.objects.update_if_newer(form.instance.pk, version=next_version(), name="theirs")
        return super().form_valid(form)


class StampingProfileUpdate(ProfileUpdate):
    """Sets a field its form does not show before the save (as an admin's save_model() may)."""

    def form_valid(self, form: ProfileForm) -> HttpResponse:
        form.instance.note = f"stamped {form.cleaned_data['score']}"
        return super().form_valid(form)


class NotingProfileUpdate(ProfileUpdate):
    """Sets a field its form does not show (a note of its own) before the save: one no column can hold."""

    def form_valid(self, form: ProfileForm) -> HttpResponse:
        form.instance.note = f"secret-7f3a {form.instance.pk}\ud800"
        return super().form_valid(form)


urlpatterns = [
    path("noting/<int:pk>/", NotingProfileUpdate.as_view(), name="profile-noting"),
    path("profiles/<int:pk>/", ProfileUpdate.as_view(), name="profile-update"),
    path("raced/<int:pk>/", RacedProfileUpdate.as_view(), name="profile-raced"),
    path("raced-name/<int:pk>/", RacedNameProfileUpdate.as_view(), name="profile-raced-name"),
    path("stamping/<int:pk>/", StampingProfileUpdate.as_view(), name="profile-stamping"),
]
