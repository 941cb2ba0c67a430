"""Re-driving failed and rejected requests: :func:`redrive` makes them ``pending`` again and delivers their
records' jobs when the transaction commits.

A request fails when transient errors outlast its job's retries (a long outage), and is rejected when
its values are refused (a constraint, a trigger, stored data no longer valid) or its row is gone. Neither
wrote anything, so once the cause is fixed, applying it again is safe; it keeps its version, so it is
applied in version order among its record's requests, as a late one would be. The admin's action on the
failed requests calls :func:`redrive`; ``safeupdates_relay --retry-failed`` is the relay's way, for failed
requests (:mod:`safeupdates.pipeline.relay`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import models, transaction

from safeupdates import conf, delivery
from safeupdates.database.transactions import after_commit
from safeupdates.models import ProcessedRequest

logger = logging.getLogger("safeupdates")


@dataclass
class Redriven:
    """What a :func:`redrive` did."""

    #: Requests made pending again.
    requests: int = 0
    #: Records whose job is delivered on commit (one job applies every pending request of its record).
    records: int = 0
    #: Requests of the selection that were not failed or rejected update requests of a record, left as
    #: they were (a second re-drive of the same request finds it pending).
    skipped: int = 0
    #: What deserves the operator's attention: a record delivered on another queue than its own, or nowhere.
    warnings: list[str] = field(default_factory=list)


def redrive(requests: models.QuerySet[Any]) -> Redriven:
    """Make the ``failed`` and ``rejected`` update requests of ``requests`` (a queryset of the request log)
    ``pending`` again, and deliver each of their records' jobs when the current transaction commits (now,
    in autocommit). The rest of the selection is left as it is and counted as ``skipped``.

    Once: the rows are locked and changed only while still failed or rejected, so a request re-driven
    twice (a double click, two operators) is made pending and delivered by one of them only. Whatever the
    delivery backend: the jobs go through :mod:`safeupdates.delivery`, and if the broker cannot be reached
    at commit the requests stay pending for the relay.
    """
    using = requests.db
    selected = list(requests.values_list("pk", flat=True))
    report = Redriven()
    with transaction.atomic(using=using):
        chosen = ProcessedRequest.objects.using(using).filter(pk__in=selected).redrive()
        report.requests, report.skipped = len(chosen), len(set(selected)) - len(chosen)
        # One delivery per record: its job applies every pending request of the record.
        records: dict[tuple[int, str], ProcessedRequest] = {}
        for request in chosen:
            records.setdefault((request.content_type_id, request.object_id), request)  # type: ignore[arg-type]
        deliveries = []
        for (content_type_id, object_id), request in records.items():
            what = f"record {content_type_id}:{object_id}"
            queue = delivery.relay_queue(request.queue or conf.queue_name(), what, report.warnings.append)
            if queue is not None:
                deliveries.append((request.request_id, content_type_id, object_id, queue, what))
        report.records = len(records)

        def deliver_on_commit() -> None:
            for request_id, content_type_id, object_id, queue, what in deliveries:
                delivery.deliver_or_leave_for_relay(
                    request_id, content_type_id, object_id, queue, what=what, using=using
                )

        if deliveries:
            after_commit(deliver_on_commit, using, robust=True)
    for warning in report.warnings:
        logger.warning("safeupdates re-drive: %s", warning)
    return report
