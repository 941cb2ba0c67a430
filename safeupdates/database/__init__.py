"""The database wing: the one place that runs a statement of its own.

- :mod:`~safeupdates.database.statements`: every hand-written SQL statement, per vendor, with its parameters;
- :mod:`~safeupdates.database.cursors`: where they run (prepared where the write path wants it);
- :mod:`~safeupdates.database.transactions`: the caller's transaction, work after commit, lock timeouts;
- :mod:`~safeupdates.database.clock`: the database's time;
- :mod:`~safeupdates.database.errors`: which errors a retry may cure, and which database said so;
- :mod:`~safeupdates.database.registry`: what the write path needs to know of a model, found through
  Django's app registry (a content type's model, the table holding its versions, the request log);
- :mod:`~safeupdates.database.internals`: the one place below Django's and psycopg's public API.

It imports nothing of the wings above it (write, delivery, pipeline) nor of the public modules.
"""
