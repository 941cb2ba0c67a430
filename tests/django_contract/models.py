# Django's test models as they are: no __str__ where Django has none, its null=True TextField.
# ruff: noqa: DJ001, DJ008
"""Django's own test models of save() and delete(), each with ``LockVersionMixin`` mixed in.

Shapes are kept as in Django's ``tests/<module>/models.py`` (named in each section): multi-table
inheritance, proxies, abstract bases, custom ``save()``/``delete()``, custom primary keys, m2m, every
``on_delete``. Where two of Django's modules use one name, the later one is prefixed (``HookPerson``,
``SignalPerson``, ``InhBase``, ``DelParent``...); the names that Django's messages print are kept.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.contenttypes.fields import GenericForeignKey, GenericRelation
from django.contrib.contenttypes.models import ContentType
from django.db import models

from safeupdates.models import LockVersionMixin

# --- update_only_fields -------------------------------------------------------------------------


class Account(LockVersionMixin):
    num = models.IntegerField()


class Person(LockVersionMixin):
    GENDER_CHOICES = (("M", "Male"), ("F", "Female"))
    name = models.CharField(max_length=20)
    gender = models.CharField(max_length=1, choices=GENDER_CHOICES)
    pid = models.IntegerField(null=True, default=None)


class Employee(Person):
    employee_num = models.IntegerField(default=0)
    profile = models.ForeignKey("Profile", models.SET_NULL, related_name="profiles", null=True)
    accounts = models.ManyToManyField("Account", related_name="employees", blank=True)  # type: ignore[var-annotated]


class NonConcreteField(models.IntegerField):  # type: ignore[type-arg]
    def db_type(self, connection: Any) -> None:
        return None

    def get_attname_column(self) -> tuple[str, None]:  # type: ignore[override]
        attname, _ = super().get_attname_column()
        return attname, None


class Profile(LockVersionMixin):
    name = models.CharField(max_length=200)
    salary = models.FloatField(default=1000.0)
    non_concrete = NonConcreteField()


class ProxyEmployee(Employee):
    class Meta:
        proxy = True


# --- basic --------------------------------------------------------------------------------------


class Article(LockVersionMixin):
    headline = models.CharField(max_length=100, default="Default headline")
    pub_date = models.DateTimeField()

    class Meta:
        ordering = ("pub_date", "headline")

    def __str__(self) -> str:
        return self.headline


class FeaturedArticle(LockVersionMixin):
    article = models.OneToOneField(Article, models.CASCADE, related_name="featured")


class ArticleSelectOnSave(Article):
    class Meta:
        proxy = True
        select_on_save = True


class SelfRef(LockVersionMixin):
    selfref = models.ForeignKey("self", models.SET_NULL, null=True, blank=True, related_name="+")
    article = models.ForeignKey(Article, models.SET_NULL, null=True, blank=True)
    article_cited = models.ForeignKey(Article, models.SET_NULL, null=True, blank=True, related_name="cited")

    def __str__(self) -> str:
        # Intentionally broken for some instances, as in Django (ticket #20278).
        return SelfRef.objects.get(selfref=self).pk  # type: ignore[return-value]


class PrimaryKeyWithDefault(LockVersionMixin):
    uuid = models.UUIDField(primary_key=True, default=uuid.uuid4)


class PrimaryKeyWithDbDefault(LockVersionMixin):
    uuid = models.IntegerField(primary_key=True, db_default=1)


class PrimaryKeyWithFalseyDefault(LockVersionMixin):
    uuid = models.IntegerField(primary_key=True, default=0)


class PrimaryKeyWithFalseyDbDefault(LockVersionMixin):
    uuid = models.IntegerField(primary_key=True, db_default=0)


class ChildPrimaryKeyWithDefault(PrimaryKeyWithDefault):
    pass


# --- force_insert_update ------------------------------------------------------------------------


class Counter(LockVersionMixin):
    name = models.CharField(max_length=10)
    value = models.IntegerField()


class InheritedCounter(Counter):
    tag = models.CharField(max_length=10)


class ProxyCounter(Counter):
    class Meta:
        proxy = True


class SubCounter(Counter):
    pass


class SubSubCounter(SubCounter):
    pass


class WithCustomPK(LockVersionMixin):
    name = models.IntegerField(primary_key=True)
    value = models.IntegerField()


class OtherSubCounter(Counter):
    other_counter_ptr = models.OneToOneField(Counter, primary_key=True, parent_link=True, on_delete=models.CASCADE)


class DiamondSubSubCounter(SubCounter, OtherSubCounter):
    pass


# --- save_delete_hooks --------------------------------------------------------------------------


class HookPerson(LockVersionMixin):
    """Django's ``save_delete_hooks.Person``: a custom save() and delete() around the real ones."""

    first_name = models.CharField(max_length=20)
    last_name = models.CharField(max_length=20)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.data: list[str] = []

    def __str__(self) -> str:
        return f"{self.first_name} {self.last_name}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.data.append("Before save")
        super().save(*args, **kwargs)
        self.data.append("After save")

    def delete(self) -> None:  # type: ignore[override]
        self.data.append("Before deletion")
        super().delete()
        self.data.append("After deletion")


# --- model_inheritance --------------------------------------------------------------------------


class CommonInfo(LockVersionMixin):
    name = models.CharField(max_length=50)
    age = models.PositiveIntegerField()

    class Meta:
        abstract = True
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.__class__.__name__} {self.name}"


class Worker(CommonInfo):
    job = models.CharField(max_length=50)


class Student(CommonInfo):
    school_class = models.CharField(max_length=10)

    class Meta:
        pass


class Post(LockVersionMixin):
    title = models.CharField(max_length=50)


class Attachment(LockVersionMixin):
    post = models.ForeignKey(
        Post,
        models.CASCADE,
        related_name="attached_%(class)s_set",
        related_query_name="attached_%(app_label)s_%(class)ss",
    )
    content = models.TextField()

    class Meta:
        abstract = True


class Comment(Attachment):
    is_spam = models.BooleanField(default=False)


class Link(Attachment):
    url = models.URLField()


class Chef(LockVersionMixin):
    name = models.CharField(max_length=50)


class Place(LockVersionMixin):
    name = models.CharField(max_length=50)
    address = models.CharField(max_length=80)


class Rating(models.Model):
    rating = models.IntegerField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-rating"]


class Restaurant(Place, Rating):
    serves_hot_dogs = models.BooleanField(default=False)
    serves_pizza = models.BooleanField(default=False)
    chef = models.ForeignKey(Chef, models.SET_NULL, null=True, blank=True)

    class Meta(Rating.Meta):
        db_table = "django_contract_my_restaurant"


class ItalianRestaurant(Restaurant):
    serves_gnocchi = models.BooleanField(default=False)


class ItalianRestaurantCommonParent(ItalianRestaurant, Place):
    place_ptr_two = models.OneToOneField(Place, on_delete=models.CASCADE, parent_link=True)


class Supplier(Place):
    customers = models.ManyToManyField(Restaurant, related_name="provider")


class CustomSupplier(Supplier):
    pass


class ParkingLot(Place):
    parent = models.OneToOneField(Place, models.CASCADE, primary_key=True, parent_link=True)
    main_site = models.ForeignKey(Place, models.CASCADE, related_name="lot")


class Title(LockVersionMixin):
    title = models.CharField(max_length=50)


class InhBase(LockVersionMixin):
    """Django's ``model_inheritance.Base``."""

    titles = models.ManyToManyField(Title)


class SubBase(InhBase):
    sub_id = models.IntegerField(primary_key=True)


class GrandParent(LockVersionMixin):
    first_name = models.CharField(max_length=80)
    last_name = models.CharField(max_length=80)
    email = models.EmailField(unique=True)
    place = models.ForeignKey(Place, models.CASCADE, null=True, related_name="+")

    class Meta:
        ordering = ["-pk"]
        unique_together = ("first_name", "last_name")


class Parent(GrandParent):
    pass


class Child(Parent):
    pass


class GrandChild(Child):
    pass


class CommonAncestor(LockVersionMixin):
    id = models.IntegerField(primary_key=True, default=1)


class FirstParent(CommonAncestor):
    first_ancestor = models.OneToOneField(CommonAncestor, models.CASCADE, primary_key=True, parent_link=True)


class SecondParent(CommonAncestor):
    second_ancestor = models.OneToOneField(CommonAncestor, models.CASCADE, primary_key=True, parent_link=True)


class CommonChild(FirstParent, SecondParent):
    pass


# --- signals ------------------------------------------------------------------------------------


class SignalPerson(LockVersionMixin):
    """Django's ``signals.Person``."""

    first_name = models.CharField(max_length=20)
    last_name = models.CharField(max_length=20)

    def __str__(self) -> str:
        return f"{self.first_name} {self.last_name}"


class Car(LockVersionMixin):
    make = models.CharField(max_length=20)
    model = models.CharField(max_length=20)


class Author(LockVersionMixin):
    name = models.CharField(max_length=20)

    def __str__(self) -> str:
        return self.name


class Book(LockVersionMixin):
    name = models.CharField(max_length=20)
    authors = models.ManyToManyField(Author)

    def __str__(self) -> str:
        return self.name


class Page(LockVersionMixin):
    book = models.ForeignKey(Book, on_delete=models.CASCADE)
    text = models.TextField()


# --- delete -------------------------------------------------------------------------------------


class P(LockVersionMixin):
    pass


class R(LockVersionMixin):
    is_default = models.BooleanField(default=False)
    p = models.ForeignKey(P, models.CASCADE, null=True)


def get_default_r() -> int:
    return R.objects.get_or_create(is_default=True)[0].pk


class S(LockVersionMixin):
    r = models.ForeignKey(R, models.CASCADE)


class T(LockVersionMixin):
    s = models.ForeignKey(S, models.CASCADE)


class U(LockVersionMixin):
    t = models.ForeignKey(T, models.CASCADE)


class RChild(R):
    pass


class RProxy(R):
    class Meta:
        proxy = True


class RChildChild(RChild):
    pass


class A(LockVersionMixin):
    name = models.CharField(max_length=30)

    auto = models.ForeignKey(R, models.CASCADE, related_name="auto_set")
    auto_nullable = models.ForeignKey(R, models.CASCADE, null=True, related_name="auto_nullable_set")
    setvalue = models.ForeignKey(R, models.SET(get_default_r), related_name="setvalue")
    setnull = models.ForeignKey(R, models.SET_NULL, null=True, related_name="setnull_set")
    setdefault = models.ForeignKey(R, models.SET_DEFAULT, default=get_default_r, related_name="setdefault_set")
    setdefault_none = models.ForeignKey(
        R, models.SET_DEFAULT, default=None, null=True, related_name="setnull_nullable_set"
    )
    cascade = models.ForeignKey(R, models.CASCADE, related_name="cascade_set")
    cascade_nullable = models.ForeignKey(R, models.CASCADE, null=True, related_name="cascade_nullable_set")
    protect = models.ForeignKey(R, models.PROTECT, null=True, related_name="protect_set")
    restrict = models.ForeignKey(R, models.RESTRICT, null=True, related_name="restrict_set")
    donothing = models.ForeignKey(R, models.DO_NOTHING, null=True, related_name="donothing_set")
    child = models.ForeignKey(RChild, models.CASCADE, related_name="child")
    child_setnull = models.ForeignKey(RChild, models.SET_NULL, null=True, related_name="child_setnull")
    cascade_p = models.ForeignKey(P, models.CASCADE, related_name="cascade_p_set", null=True)
    o2o_setnull = models.ForeignKey(R, models.SET_NULL, null=True, related_name="o2o_nullable_set")


class B(LockVersionMixin):
    protect = models.ForeignKey(R, models.PROTECT)


def create_a(name: str) -> A:
    a = A(name=name)
    for field in (
        "auto",
        "auto_nullable",
        "setvalue",
        "setnull",
        "setdefault",
        "setdefault_none",
        "cascade",
        "cascade_nullable",
        "protect",
        "restrict",
        "donothing",
        "o2o_setnull",
    ):
        setattr(a, field, R.objects.create())
    a.child = RChild.objects.create()
    a.child_setnull = RChild.objects.create()
    a.save()
    return a


class M(LockVersionMixin):
    m2m = models.ManyToManyField(R, related_name="m_set")
    m2m_through = models.ManyToManyField(R, through="MR", related_name="m_through_set")  # type: ignore[var-annotated]
    m2m_through_null = models.ManyToManyField(  # type: ignore[var-annotated]
        R, through="MRNull", related_name="m_through_null_set"
    )


class MR(LockVersionMixin):
    m = models.ForeignKey(M, models.CASCADE)
    r = models.ForeignKey(R, models.CASCADE)


class MRNull(LockVersionMixin):
    m = models.ForeignKey(M, models.CASCADE)
    r = models.ForeignKey(R, models.SET_NULL, null=True)


class Avatar(LockVersionMixin):
    desc = models.TextField(null=True)


class AvatarProxy(Avatar):
    class Meta:
        proxy = True


class User(LockVersionMixin):
    avatar = models.ForeignKey(Avatar, models.CASCADE, null=True)


class HiddenUser(LockVersionMixin):
    r = models.ForeignKey(R, models.CASCADE, related_name="+")


class HiddenUserProfile(LockVersionMixin):
    user = models.ForeignKey(HiddenUser, models.CASCADE)


class M2MTo(LockVersionMixin):
    pass


class M2MFrom(LockVersionMixin):
    m2m = models.ManyToManyField(M2MTo)


class DelParent(LockVersionMixin):
    """Django's ``delete.Parent``."""


class DelChild(DelParent):
    """Django's ``delete.Child``."""


class DelBase(LockVersionMixin):
    """Django's ``delete.Base``."""


class RelToBase(LockVersionMixin):
    base = models.ForeignKey(DelBase, models.DO_NOTHING, related_name="rels")


class Origin(LockVersionMixin):
    r_proxy = models.ForeignKey("RProxy", models.CASCADE, null=True)


class Referrer(LockVersionMixin):
    origin = models.ForeignKey(Origin, models.CASCADE)
    unique_field = models.IntegerField(unique=True)
    large_field = models.TextField()


class SecondReferrer(LockVersionMixin):
    referrer = models.ForeignKey(Referrer, models.CASCADE)
    other_referrer = models.ForeignKey(Referrer, models.CASCADE, to_field="unique_field", related_name="+")


class DeleteTop(LockVersionMixin):
    b1 = GenericRelation("GenericB1")
    b2 = GenericRelation("GenericB2")


class B1(LockVersionMixin):
    delete_top = models.ForeignKey(DeleteTop, models.CASCADE)


class B2(LockVersionMixin):
    delete_top = models.ForeignKey(DeleteTop, models.CASCADE)


class B3(LockVersionMixin):
    restrict = models.ForeignKey(R, models.RESTRICT)


class DeleteBottom(LockVersionMixin):
    b1 = models.ForeignKey(B1, models.RESTRICT)
    b2 = models.ForeignKey(B2, models.CASCADE)


class GenericB1(LockVersionMixin):
    content_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    object_id = models.PositiveIntegerField()
    generic_delete_top = GenericForeignKey("content_type", "object_id")


class GenericB2(LockVersionMixin):
    content_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    object_id = models.PositiveIntegerField()
    generic_delete_top = GenericForeignKey("content_type", "object_id")
    generic_delete_bottom = GenericRelation("GenericDeleteBottom")


class GenericDeleteBottom(LockVersionMixin):
    generic_b1 = models.ForeignKey(GenericB1, models.RESTRICT)
    content_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    object_id = models.PositiveIntegerField()
    generic_b2 = GenericForeignKey()


class GenericDeleteBottomParent(LockVersionMixin):
    generic_delete_bottom = models.ForeignKey(GenericDeleteBottom, on_delete=models.CASCADE)


# --- transactions -------------------------------------------------------------------------------


class Reporter(LockVersionMixin):
    first_name = models.CharField(max_length=30)
    last_name = models.CharField(max_length=30)
    email = models.EmailField()

    class Meta:
        ordering = ("first_name", "last_name")

    def __str__(self) -> str:
        return f"{self.first_name} {self.last_name}".strip()
