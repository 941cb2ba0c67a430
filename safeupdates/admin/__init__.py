"""The admin of safeupdates: conflict-safe admin for your ``LockVersionMixin`` models, and the request log.

- :class:`SafeUpdateAdminMixin` (ready made: :class:`SafeUpdateModelAdmin`, and inlines) carries a signed
  edit token through every way the admin writes a record (:mod:`safeupdates.admin.mixins`);
- :class:`ProcessedRequestAdmin`, the read-only request log, registered here, with its status page
  (:mod:`safeupdates.admin.requestlog`, :mod:`safeupdates.admin.status`);
- :class:`FailedRequestAdmin`, its failed and rejected requests, and the action that re-drives them
  (:mod:`safeupdates.admin.failed`).
"""

from __future__ import annotations

from safeupdates.admin.failed import FailedRequestAdmin
from safeupdates.admin.mixins import (
    ReadOnlyAdmin,
    SafeUpdateAdminMixin,
    SafeUpdateInlineMixin,
    SafeUpdateModelAdmin,
    SafeUpdateStackedInline,
    SafeUpdateTabularInline,
    request_log_url,
)
from safeupdates.admin.requestlog import ProcessedRequestAdmin

__all__ = [
    "FailedRequestAdmin",
    "ProcessedRequestAdmin",
    "ReadOnlyAdmin",
    "SafeUpdateAdminMixin",
    "SafeUpdateInlineMixin",
    "SafeUpdateModelAdmin",
    "SafeUpdateStackedInline",
    "SafeUpdateTabularInline",
    "request_log_url",
]
