"""Django's ``tests/signals/tests.py`` on models with ``LockVersionMixin``: the model signals that
save() and delete() send, and their arguments."""

from __future__ import annotations

from typing import Any

from django.db.models import signals
from django.dispatch import receiver
from django.test import TestCase

from .models import Author, Book, Car, Page, SignalPerson


class SignalTests(TestCase):
    def setUp(self) -> None:
        # Django's BaseSignalSetup: every receiver a test connects is disconnected again.
        self.pre_signals = self._signal_counts()

    def tearDown(self) -> None:
        self.assertEqual(self.pre_signals, self._signal_counts())

    def _signal_counts(self) -> tuple[int, ...]:
        counts = []
        for signal in (signals.pre_save, signals.post_save, signals.pre_delete, signals.post_delete):
            with signal.lock:
                signal._clear_dead_receivers()
            counts.append(len(signal.receivers))
        return tuple(counts)

    def test_save_signals(self) -> None:
        """Django: tests/signals/tests.py::SignalTests::test_save_signals"""
        data: list[tuple[Any, ...]] = []

        def pre_save_handler(signal: Any, sender: Any, instance: Any, **kwargs: Any) -> None:
            data.append((instance, sender, kwargs.get("raw", False)))

        def post_save_handler(signal: Any, sender: Any, instance: Any, **kwargs: Any) -> None:
            data.append((instance, sender, kwargs.get("created"), kwargs.get("raw", False)))

        signals.pre_save.connect(pre_save_handler, weak=False)
        signals.post_save.connect(post_save_handler, weak=False)
        try:
            p1 = SignalPerson.objects.create(first_name="John", last_name="Smith")
            self.assertEqual(data, [(p1, SignalPerson, False), (p1, SignalPerson, True, False)])
            data[:] = []

            p1.first_name = "Tom"
            p1.save()
            self.assertEqual(data, [(p1, SignalPerson, False), (p1, SignalPerson, False, False)])
            data[:] = []

            # Calling an internal method purely so that we can trigger a "raw" save.
            p1.save_base(raw=True)
            self.assertEqual(data, [(p1, SignalPerson, True), (p1, SignalPerson, False, True)])
            data[:] = []

            p2 = SignalPerson(first_name="James", last_name="Jones")
            p2.id = 99999
            p2.save()
            self.assertEqual(data, [(p2, SignalPerson, False), (p2, SignalPerson, True, False)])
            data[:] = []
            p2.id = 99998
            p2.save()
            self.assertEqual(data, [(p2, SignalPerson, False), (p2, SignalPerson, True, False)])

            # The sender should stay the same when using defer().
            data[:] = []
            p3 = SignalPerson.objects.defer("first_name").get(pk=p1.pk)
            p3.last_name = "Reese"
            p3.save()
            self.assertEqual(data, [(p3, SignalPerson, False), (p3, SignalPerson, False, False)])
        finally:
            signals.pre_save.disconnect(pre_save_handler)
            signals.post_save.disconnect(post_save_handler)

    def test_delete_signals(self) -> None:
        """Django: tests/signals/tests.py::SignalTests::test_delete_signals"""
        data: list[tuple[Any, ...]] = []

        def pre_delete_handler(signal: Any, sender: Any, instance: Any, origin: Any, **kwargs: Any) -> None:
            data.append((instance, sender, instance.id is None, origin))

        # #8285: signals can be any callable
        class PostDeleteHandler:
            def __init__(self, data: list[tuple[Any, ...]]) -> None:
                self.data = data

            def __call__(self, signal: Any, sender: Any, instance: Any, origin: Any, **kwargs: Any) -> None:
                self.data.append((instance, sender, instance.id is None, origin))

        post_delete_handler = PostDeleteHandler(data)
        signals.pre_delete.connect(pre_delete_handler, weak=False)
        signals.post_delete.connect(post_delete_handler, weak=False)
        try:
            p1 = SignalPerson.objects.create(first_name="John", last_name="Smith")
            p1.delete()
            self.assertEqual(data, [(p1, SignalPerson, False, p1), (p1, SignalPerson, False, p1)])
            data[:] = []

            p2 = SignalPerson(first_name="James", last_name="Jones")
            p2.id = 99999
            p2.save()
            p2.id = 99998
            p2.save()
            p2.delete()
            self.assertEqual(data, [(p2, SignalPerson, False, p2), (p2, SignalPerson, False, p2)])
            data[:] = []
            self.assertQuerySetEqual(SignalPerson.objects.all(), ["James Jones"], str)
        finally:
            signals.pre_delete.disconnect(pre_delete_handler)
            signals.post_delete.disconnect(post_delete_handler)

    def test_delete_signals_origin_model(self) -> None:
        """Django: tests/signals/tests.py::SignalTests::test_delete_signals_origin_model"""
        data: list[tuple[Any, ...]] = []

        def pre_delete_handler(signal: Any, sender: Any, instance: Any, origin: Any, **kwargs: Any) -> None:
            data.append((sender, origin))

        def post_delete_handler(signal: Any, sender: Any, instance: Any, origin: Any, **kwargs: Any) -> None:
            data.append((sender, origin))

        person = SignalPerson.objects.create(first_name="John", last_name="Smith")
        book = Book.objects.create(name="Rayuela")
        Page.objects.create(text="Page 1", book=book)
        Page.objects.create(text="Page 2", book=book)
        signals.pre_delete.connect(pre_delete_handler, weak=False)
        signals.post_delete.connect(post_delete_handler, weak=False)
        try:
            # Instance deletion.
            person.delete()
            self.assertEqual(data, [(SignalPerson, person), (SignalPerson, person)])
            data[:] = []
            # Cascade deletion.
            book.delete()
            self.assertEqual(data, [(Page, book), (Page, book), (Book, book), (Page, book), (Page, book), (Book, book)])
        finally:
            signals.pre_delete.disconnect(pre_delete_handler)
            signals.post_delete.disconnect(post_delete_handler)

    def test_delete_signals_origin_queryset(self) -> None:
        """Django: tests/signals/tests.py::SignalTests::test_delete_signals_origin_queryset"""
        data: list[tuple[Any, ...]] = []

        def pre_delete_handler(signal: Any, sender: Any, instance: Any, origin: Any, **kwargs: Any) -> None:
            data.append((sender, origin))

        def post_delete_handler(signal: Any, sender: Any, instance: Any, origin: Any, **kwargs: Any) -> None:
            data.append((sender, origin))

        SignalPerson.objects.create(first_name="John", last_name="Smith")
        book = Book.objects.create(name="Rayuela")
        Page.objects.create(text="Page 1", book=book)
        Page.objects.create(text="Page 2", book=book)
        signals.pre_delete.connect(pre_delete_handler, weak=False)
        signals.post_delete.connect(post_delete_handler, weak=False)
        try:
            # Queryset deletion.
            qs = SignalPerson.objects.all()
            qs.delete()
            self.assertEqual(data, [(SignalPerson, qs), (SignalPerson, qs)])
            data[:] = []
            # Cascade deletion.
            books = Book.objects.all()
            books.delete()
            self.assertEqual(
                data, [(Page, books), (Page, books), (Book, books), (Page, books), (Page, books), (Book, books)]
            )
        finally:
            signals.pre_delete.disconnect(pre_delete_handler)
            signals.post_delete.disconnect(post_delete_handler)

    def test_decorators(self) -> None:
        """Django: tests/signals/tests.py::SignalTests::test_decorators"""
        data = []

        @receiver(signals.pre_save, weak=False)
        def decorated_handler(signal: Any, sender: Any, instance: Any, **kwargs: Any) -> None:
            data.append(instance)

        @receiver(signals.pre_save, sender=Car, weak=False)
        def decorated_handler_with_sender_arg(signal: Any, sender: Any, instance: Any, **kwargs: Any) -> None:
            data.append(instance)

        try:
            c1 = Car.objects.create(make="Volkswagen", model="Passat")
            self.assertEqual(data, [c1, c1])
        finally:
            signals.pre_save.disconnect(decorated_handler)
            signals.pre_save.disconnect(decorated_handler_with_sender_arg, sender=Car)

    def test_save_and_delete_signals_with_m2m(self) -> None:
        """Django: tests/signals/tests.py::SignalTests::test_save_and_delete_signals_with_m2m"""
        data = []

        def pre_save_handler(signal: Any, sender: Any, instance: Any, **kwargs: Any) -> None:
            data.append(f"pre_save signal, {instance}")
            if kwargs.get("raw"):
                data.append("Is raw")

        def post_save_handler(signal: Any, sender: Any, instance: Any, **kwargs: Any) -> None:
            data.append(f"post_save signal, {instance}")
            if "created" in kwargs:
                data.append("Is created" if kwargs["created"] else "Is updated")
            if kwargs.get("raw"):
                data.append("Is raw")

        def pre_delete_handler(signal: Any, sender: Any, instance: Any, **kwargs: Any) -> None:
            data.append(f"pre_delete signal, {instance}")
            data.append(f"instance.id is not None: {instance.id is not None}")

        def post_delete_handler(signal: Any, sender: Any, instance: Any, **kwargs: Any) -> None:
            data.append(f"post_delete signal, {instance}")
            data.append(f"instance.id is not None: {instance.id is not None}")

        signals.pre_save.connect(pre_save_handler, weak=False)
        signals.post_save.connect(post_save_handler, weak=False)
        signals.pre_delete.connect(pre_delete_handler, weak=False)
        signals.post_delete.connect(post_delete_handler, weak=False)
        try:
            a1 = Author.objects.create(name="Neal Stephenson")
            self.assertEqual(
                data, ["pre_save signal, Neal Stephenson", "post_save signal, Neal Stephenson", "Is created"]
            )
            data[:] = []
            b1 = Book.objects.create(name="Snow Crash")
            self.assertEqual(data, ["pre_save signal, Snow Crash", "post_save signal, Snow Crash", "Is created"])
            data[:] = []
            # Assigning and removing to/from m2m shouldn't generate an m2m signal.
            b1.authors.set([a1])
            self.assertEqual(data, [])
            b1.authors.set([])
            self.assertEqual(data, [])
        finally:
            signals.pre_save.disconnect(pre_save_handler)
            signals.post_save.disconnect(post_save_handler)
            signals.pre_delete.disconnect(pre_delete_handler)
            signals.post_delete.disconnect(post_delete_handler)

    def test_disconnect_in_dispatch(self) -> None:
        """Django: tests/signals/tests.py::SignalTests::test_disconnect_in_dispatch"""

        class Handler:
            def __init__(self, param: int) -> None:
                self.param = param
                self._run = False

            def __call__(self, signal: Any, sender: Any, **kwargs: Any) -> None:
                self._run = True
                signal.disconnect(receiver=self, sender=sender)

        before = list(signals.post_save.receivers)
        a, b = Handler(1), Handler(2)
        signals.post_save.connect(a, sender=SignalPerson, weak=False)
        signals.post_save.connect(b, sender=SignalPerson, weak=False)
        SignalPerson.objects.create(first_name="John", last_name="Smith")
        self.assertTrue(a._run)
        self.assertTrue(b._run)
        # Django asserts no receivers at all: the suite's other apps connect their own.
        self.assertEqual(signals.post_save.receivers, before)
