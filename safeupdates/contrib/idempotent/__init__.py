"""``@idempotent`` (:func:`~safeupdates.contrib.idempotent.decorators.idempotent`): a side effect that
completes at most once per key. Add ``"safeupdates.contrib.idempotent"`` to ``INSTALLED_APPS`` to use it."""
