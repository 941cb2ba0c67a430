"""factory-boy factories of the demo's users and profiles, for the tests of the demo."""

# factory-boy declares no types.
# mypy: disable-error-code="attr-defined,no-untyped-call,type-arg,misc"

from __future__ import annotations

from typing import Any

import factory
from django.contrib.auth import get_user_model

from demo_project.toggles.models import Profile

PASSWORD = "pw-for-tests"


class UserFactory(factory.django.DjangoModelFactory):
    """A user whose password is :data:`PASSWORD`."""

    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password(PASSWORD)

    @classmethod
    def superuser(cls, **kwargs: Any) -> Any:
        """A staff superuser, who may use the admin."""
        return cls(is_staff=True, is_superuser=True, **kwargs)


class ProfileFactory(factory.django.DjangoModelFactory):
    """A profile with every toggle off, for a new user."""

    class Meta:
        model = Profile

    user = factory.SubFactory(UserFactory)
