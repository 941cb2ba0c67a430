"""Optional parts, apart from the core write path, which never imports them.

- ``safeupdates.contrib.batches``, ``safeupdates.contrib.controls``, ``safeupdates.contrib.idempotent``:
  the job tools (``fan_out()``, ``enqueue()``, ``@idempotent``), Django apps to add to ``INSTALLED_APPS``
  when you use them. The old import paths (``safeupdates.fan_out``, ``safeupdates.batches`` ...) still work.
- ``safeupdates.contrib.drf``: an integration that needs its extra installed (``django-safeupdates[drf]``).
"""
