from __future__ import annotations

import factory

from tests.testapp.models import Document, Profile


class ProfileFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Profile

    name = factory.Sequence(lambda n: f"user{n}")


class DocumentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Document

    title = factory.Sequence(lambda n: f"doc {n}")
