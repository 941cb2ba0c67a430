"""Fan-out / fan-in batches: :func:`~safeupdates.contrib.batches.jobs.fan_out` runs one job per item and
the reduce exactly once at the end. Add ``"safeupdates.contrib.batches"`` to ``INSTALLED_APPS`` to use it:
without it, importing this package raises ``ImproperlyConfigured``."""

from safeupdates.contrib import guard_app

guard_app(__name__)
