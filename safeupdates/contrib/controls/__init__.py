"""Job controls on RQ (:func:`~safeupdates.contrib.controls.jobs.enqueue`): unique-while-queued, per-key
serial (FIFO) and throttled jobs. Add ``"safeupdates.contrib.controls"`` to ``INSTALLED_APPS`` to use them:
without it, importing this package raises ``ImproperlyConfigured``."""

from safeupdates.contrib import guard_app

guard_app(__name__)
