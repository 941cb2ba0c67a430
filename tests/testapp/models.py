from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

from django.db import models
from django.db.models.functions import Now

from safeupdates.managers import SafeUpdateManager
from safeupdates.models import LockVersionMixin, SafeUpdateModel


class Profile(SafeUpdateModel):
    """A user's settings, toggled from queued jobs."""

    name = models.CharField(max_length=20, default="")
    active = models.BooleanField(default=False)
    newsletter = models.BooleanField(default=False)
    dark_mode = models.BooleanField(default=False)
    score = models.IntegerField(default=0)
    note = models.TextField(blank=True, default="")

    safe_update_fields: ClassVar[tuple[str, ...]] = ("name", "active", "newsletter", "dark_mode", "score")

    class Meta:
        # A rule only the database knows, for the tests of values the database refuses.
        constraints = [
            models.CheckConstraint(condition=~models.Q(score=-13), name="testapp_profile_score_not_minus_13")
        ]

    def __str__(self) -> str:
        return self.name or f"profile {self.pk}"


class Document(LockVersionMixin):
    """A model with optimistic locking only (no manager of safeupdates)."""

    title = models.CharField(max_length=100)
    body = models.TextField(blank=True, default="")


class ReduceRun(models.Model):
    """One row per run of a fan-out's reduce, so that tests can count them."""

    batch_id = models.CharField(max_length=36)

    def __str__(self) -> str:
        return self.batch_id


class ActiveOnlyProfile(Profile):
    """A proxy that lets queued jobs change ``active`` only (narrower than its concrete model)."""

    safe_update_fields = ("active",)

    class Meta:
        proxy = True


class Gadget(SafeUpdateModel):
    """Fields of several types, for the tests of values an update must refuse or accept."""

    label = models.CharField(max_length=40, default="")
    count = models.IntegerField(default=0)
    ratio = models.FloatField(default=0.0)
    # null=True without blank=True: None is a valid value for the database, and must be accepted.
    nickname = models.CharField(max_length=20, null=True)  # noqa: DJ001 - None must be a valid value here
    seen_at = models.DateTimeField(null=True, blank=True)

    safe_update_fields = ("label", "count", "ratio", "nickname", "seen_at")


class Tag(SafeUpdateModel):
    """A character primary key, which may be longer than the request log's ``object_id``."""

    code = models.CharField(primary_key=True, max_length=300)
    label = models.CharField(max_length=40, default="")

    safe_update_fields = ("label",)


class Ticket(SafeUpdateModel):
    """A primary key declared after another field: the row's first column is not its key."""

    label = models.CharField(max_length=40, default="")
    number = models.CharField(primary_key=True, max_length=20)

    safe_update_fields = ("label",)

    def __str__(self) -> str:
        return self.number


class Place(SafeUpdateModel):
    """Parent of a multi-table inheritance pair."""

    name = models.CharField(max_length=40, default="")
    open = models.BooleanField(default=False)

    safe_update_fields: ClassVar[tuple[str, ...]] = ("name", "open")


class Review(models.Model):
    """A plain foreign key to ``Place``, declared before its child: ``Place``'s reverse relations list
    this one, which links no child, first."""

    place = models.ForeignKey(Place, on_delete=models.CASCADE, related_name="reviews")
    text = models.CharField(max_length=40, default="")

    def __str__(self) -> str:
        return self.text


class Restaurant(Place):
    """Child of a multi-table inheritance pair: fields in two tables, one row each."""

    serves_pizza = models.BooleanField(default=False)
    seats = models.IntegerField(default=0)

    safe_update_fields = ("name", "open", "serves_pizza", "seats")


class CountsUpdates(models.Model):
    """Another library's mixin that overrides ``_do_update`` (as django-prometheus's does), placed
    before ``LockVersionMixin`` in the bases: its override wraps ours."""

    updates_seen = 0

    class Meta:
        abstract = True

    def _do_update(self, *args: Any, **kwargs: Any) -> Any:
        type(self).updates_seen += 1
        return super()._do_update(*args, **kwargs)  # type: ignore[misc]


class Invoice(CountsUpdates, LockVersionMixin):
    """A generated column that Django 6 refreshes after ``save()`` from the UPDATE's RETURNING."""

    net = models.IntegerField(default=0)
    gross = models.GeneratedField(expression=models.F("net") * 2, output_field=models.IntegerField(), db_persist=True)

    def __str__(self) -> str:
        return f"invoice {self.pk}"


class Refund(Invoice):
    """A multi-table child with a generated column of its own, refreshed from its table's UPDATE."""

    fee = models.IntegerField(default=0)
    total = models.GeneratedField(expression=models.F("fee") * 3, output_field=models.IntegerField(), db_persist=True)

    def __str__(self) -> str:
        return f"refund {self.pk}"


class Bookmark(SafeUpdateModel):
    """A foreign key that queued jobs may change: its target must exist on the database written to."""

    document = models.ForeignKey(Document, null=True, on_delete=models.SET_NULL, related_name="+")
    label = models.CharField(max_length=40, default="")

    safe_update_fields = ("document", "label")

    def __str__(self) -> str:
        return self.label


class Chapter(LockVersionMixin):
    """A row with its own lock_version, edited inline on its document's admin page."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chapters")
    title = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.title


class Shade(models.TextChoices):
    LIGHT = "light"
    DARK = "dark"


class Level(models.IntegerChoices):
    LOW = 1
    HIGH = 2


class ShoutField(models.CharField):  # type: ignore[type-arg]
    """A field whose own ``get_db_prep_save`` changes what is stored (upper case)."""

    def get_db_prep_save(self, value: Any, connection: Any) -> Any:
        value = super().get_db_prep_save(value, connection)
        return value.upper() if isinstance(value, str) else value


class _Specimen(models.Model):
    """One field of each kind the ORM binds in its own way (``get_db_prep_save``)."""

    amount = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    ratio = models.FloatField(default=0.0)
    big = models.BigIntegerField(default=0)
    text = models.TextField(default="")
    happened_at = models.DateTimeField(null=True)
    day = models.DateField(null=True)
    at = models.TimeField(null=True)
    took = models.DurationField(null=True)
    token = models.UUIDField(null=True)
    data = models.JSONField(null=True)
    blob = models.BinaryField(null=True)
    address = models.GenericIPAddressField(null=True)
    document = models.ForeignKey(Document, null=True, on_delete=models.SET_NULL, related_name="+")
    shade = models.CharField(max_length=5, choices=Shade.choices, default=Shade.LIGHT)
    level = models.IntegerField(choices=Level.choices, default=Level.LOW)
    odd = models.CharField(max_length=20, default="", db_column="Odd Col; -- select")
    shout = ShoutField(max_length=20, default="")
    touched_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class PlainSpecimen(_Specimen):
    """Saved by Django's own ``save()``: what ``Specimen`` must store for the same values."""

    def __str__(self) -> str:
        return f"plain specimen {self.pk}"


class Specimen(LockVersionMixin, _Specimen):
    """Saved by ``LockVersionMixin.save()``, whose UPDATE binds the values itself."""

    def __str__(self) -> str:
        return f"specimen {self.pk}"


class ShelfManager(models.Manager["Shelved"]):
    """A base manager that hides shelved rows (Django advises against it; some projects do it)."""

    def get_queryset(self) -> models.QuerySet[Shelved]:
        return super().get_queryset().filter(shelved=False)


class Shelved(LockVersionMixin):
    """A model whose base manager filters: ``save()`` matches only rows that manager sees, as Django's."""

    title = models.CharField(max_length=40, default="")
    shelved = models.BooleanField(default=False)

    objects = models.Manager()
    on_shelf = ShelfManager()

    class Meta:
        base_manager_name = "on_shelf"

    def __str__(self) -> str:
        return self.title


@dataclass(frozen=True)
class Point:
    """A value of a type of its own, which JSON cannot encode (as a geometry or a range)."""

    x: int
    y: int

    def __str__(self) -> str:
        return f"{self.x},{self.y}"


class PointField(models.TextField):  # type: ignore[type-arg]
    """Stores a :class:`Point` as ``"x,y"``."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Point | None:
        return self.to_python(value)

    def to_python(self, value: Any) -> Point | None:
        if value is None or isinstance(value, Point):
            return value
        x, y = str(value).split(",")
        return Point(int(x), int(y))

    def get_prep_value(self, value: Any) -> Any:
        return None if value is None else str(value)


class Attachment(LockVersionMixin):
    """Values that JSON cannot encode: a file, bytes, a custom type."""

    title = models.CharField(max_length=40, default="")
    file = models.FileField(upload_to="attachments/", blank=True)
    blob = models.BinaryField(default=b"", editable=True, blank=True)
    spot = PointField(default="0,0")
    secret = models.CharField(max_length=40, default="", blank=True)
    kind = models.CharField(max_length=10, choices=[("note", "Note"), ("image", "Image")], default="note")

    def __str__(self) -> str:
        return self.title or f"attachment {self.pk}"


class Stamp(LockVersionMixin):
    """A primary key the database fills in (``db_default``), which the INSERT returns."""

    at = models.DateTimeField(primary_key=True, db_default=Now())
    note = models.CharField(max_length=40, default="")

    def __str__(self) -> str:
        return self.note


class Vendor(SafeUpdateModel):
    """Parent of two multi-table children: a row's versions map holds the fields of both."""

    name = models.CharField(max_length=40, default="")

    safe_update_fields: ClassVar[tuple[str, ...]] = ("name",)

    def __str__(self) -> str:
        return self.name


class Bakery(Vendor):
    loaves = models.IntegerField(default=0)

    safe_update_fields = ("name", "loaves")


class Florist(Vendor):
    bouquets = models.IntegerField(default=0)

    safe_update_fields = ("name", "bouquets")


class Vehicle(models.Model):
    """A plain concrete parent: its table is written before the versions table of ``Truck``."""

    wheels = models.IntegerField(default=4)

    def __str__(self) -> str:
        return f"vehicle {self.pk}"


class Truck(LockVersionMixin, Vehicle):
    load = models.IntegerField(default=0)


class Van(Vehicle):
    """A sibling of ``Truck`` below the plain parent: its fields are in no row that holds versions."""

    doors = models.IntegerField(default=2)


class Shelter(LockVersionMixin):
    """A parent whose only multi-table child adds no field of its own."""

    name = models.CharField(max_length=40, default="")
    slug = models.SlugField(max_length=8, default="")  # two validators: a value can fail both

    def __str__(self) -> str:
        return self.name


class Visit(models.Model):
    """A plain foreign key to ``Shelter``: a reverse relation that is no parent link."""

    shelter = models.ForeignKey(Shelter, on_delete=models.CASCADE, related_name="visits")
    note = models.CharField(max_length=40, default="")

    def __str__(self) -> str:
        return self.note


class Kennel(Shelter):
    """A multi-table child with no field but its parent link."""


class Logbook(LockVersionMixin):
    """Fields whose ``pre_save()`` fills them in on the INSERT only (``auto_now_add``) or on every save."""

    entry = models.CharField(max_length=40, default="")
    opened_at = models.DateTimeField(auto_now_add=True)
    written_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.entry


class ArchivedHidden(SafeUpdateManager):  # type: ignore[misc,valid-type,type-arg,unused-ignore]
    """A default manager that hides archived rows (soft delete): Django's own internal reads use the base
    manager, and so must safeupdates'."""

    def get_queryset(self) -> models.QuerySet[Any]:
        return super().get_queryset().filter(archived=False)


class Memo(SafeUpdateModel):
    """A record whose default manager hides some rows (``objects`` leaves out the archived ones)."""

    text = models.CharField(max_length=40, default="")
    pinned = models.BooleanField(default=False)
    archived = models.BooleanField(default=False)

    objects: ClassVar[ArchivedHidden] = ArchivedHidden()

    safe_update_fields: ClassVar[tuple[str, ...]] = ("text", "pinned")

    def __str__(self) -> str:
        return self.text


class TaggedMemo(Memo):
    """A multi-table child of ``Memo``, whose default manager hides the archived rows too."""

    tag = models.CharField(max_length=20, default="")

    objects: ClassVar[ArchivedHidden] = ArchivedHidden()

    safe_update_fields: ClassVar[tuple[str, ...]] = ("text", "pinned", "tag")


class Everything(SafeUpdateModel):
    """A field of every kind Django ships (but PostgreSQL's own), each writable by queued jobs: the
    hostile values' property test (tests/test_hostile_values.py) drives every entry point with it."""

    flag = models.BooleanField(default=False)
    small = models.SmallIntegerField(default=0)
    count = models.IntegerField(default=0)
    big = models.BigIntegerField(default=0)
    positive = models.PositiveIntegerField(default=0)
    ratio = models.FloatField(default=0.0)
    amount = models.DecimalField(max_digits=8, decimal_places=3, default=0)
    name = models.CharField(max_length=30, default="", blank=True)
    text = models.TextField(default="", blank=True)
    slug = models.SlugField(max_length=20, default="", blank=True)
    email = models.EmailField(default="", blank=True)
    url = models.URLField(default="", blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)
    day = models.DateField(null=True, blank=True)
    at = models.TimeField(null=True, blank=True)
    happened_at = models.DateTimeField(null=True, blank=True)
    took = models.DurationField(null=True, blank=True)
    token = models.UUIDField(null=True, blank=True)
    data = models.JSONField(null=True, blank=True)
    blob = models.BinaryField(null=True, blank=True, editable=True)
    file = models.FileField(upload_to="everything/", max_length=50, default="", blank=True)
    spot = PointField(default="0,0")
    document = models.ForeignKey(Document, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    safe_update_fields: ClassVar[tuple[str, ...]] = (
        "flag",
        "small",
        "count",
        "big",
        "positive",
        "ratio",
        "amount",
        "name",
        "text",
        "slug",
        "email",
        "url",
        "address",
        "day",
        "at",
        "happened_at",
        "took",
        "token",
        "data",
        "blob",
        "file",
        "spot",
        "document",
    )

    def __str__(self) -> str:
        return f"everything {self.pk}"


class NumbersAndSets(json.JSONEncoder):
    """A JSONField's own encoder: decimals as JSON numbers, sets as sorted lists (the request log's
    encoder writes a decimal as a string and knows no set)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, Decimal):
            return float(o)
        if isinstance(o, set | frozenset):
            return sorted(o)
        return super().default(o)


class Priced(SafeUpdateModel):
    """A JSONField with an encoder of its own."""

    data = models.JSONField(null=True, blank=True, encoder=NumbersAndSets)

    safe_update_fields: ClassVar[tuple[str, ...]] = ("data",)
