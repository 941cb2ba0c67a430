"""``@idempotent`` (:func:`~safeupdates.contrib.idempotent.decorators.idempotent`): a side effect that
completes at most once per key. Add ``"safeupdates.contrib.idempotent"`` to ``INSTALLED_APPS`` to use it:
without it, importing this package raises ``ImproperlyConfigured``."""

from safeupdates.contrib import guard_app

guard_app(__name__)
