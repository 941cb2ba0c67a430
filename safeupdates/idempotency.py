"""Old import path of ``@idempotent``, now the app :mod:`safeupdates.contrib.idempotent`."""

from __future__ import annotations

from safeupdates.contrib.idempotent.decorators import SKIPPED, TASK_NAMESPACE, idempotent, task_log_key

__all__ = ["SKIPPED", "TASK_NAMESPACE", "idempotent", "task_log_key"]
