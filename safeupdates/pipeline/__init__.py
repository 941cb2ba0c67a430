"""The pipeline wing: the stages a request goes through, one module each.

1. :mod:`~safeupdates.pipeline.enqueue`: ``enqueue_update()`` records the request ``pending`` in the
   caller's transaction (the outbox) and hands its record's job to the delivery seam on commit;
2. :mod:`~safeupdates.pipeline.apply`: the job applies every pending request of its record, newest
   version per field, and records each outcome through :mod:`safeupdates.lifecycle`;
3. :mod:`~safeupdates.pipeline.relay`: what stays pending too long is delivered again;
4. :mod:`~safeupdates.pipeline.redrive`: failed and rejected requests, once their cause is fixed, are made
   pending and delivered again (the admin's action).

The stages reach a queue only through :mod:`safeupdates.delivery`, and write rows only through
:mod:`safeupdates.write`. Their public names are those of :mod:`safeupdates.jobs`.
"""
