"""The write wing: the save path and the guarded write of model rows.

- :mod:`~safeupdates.write.mixins`: ``LockVersionMixin`` and ``SyncedAtMixin``, the checked ``save()``
  and ``delete()``;
- :mod:`~safeupdates.write.guard`: the per-field rule, one guarded write of one row;
- :mod:`~safeupdates.write.bulk`: many guarded writes at once;
- :mod:`~safeupdates.write.merge`: the newest version per field wins;
- :mod:`~safeupdates.write.outcome`: what a write did (applied, stale, missing);
- :mod:`~safeupdates.write.validation`: what may be written, refused before any statement runs.

It imports nothing of the pipeline or of delivery (an import-linter contract): the write path works the
same whatever delivers the jobs, or with no jobs at all.
"""
