"""The admin of safeupdates: conflict-safe admin for your ``LockVersionMixin`` models, and the request log.

- :class:`SafeUpdateAdminMixin` (ready made: :class:`SafeUpdateModelAdmin`, and inlines) carries a signed
  edit token through every way the admin writes a record (:mod:`safeupdates.admin.mixins`);
- :class:`ProcessedRequestAdmin`, the read-only request log, registered here, with its status page
  (:mod:`safeupdates.admin.requestlog`, :mod:`safeupdates.admin.status`).
"""

from __future__ import annotations

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
    "ProcessedRequestAdmin",
    "ReadOnlyAdmin",
    "SafeUpdateAdminMixin",
    "SafeUpdateInlineMixin",
    "SafeUpdateModelAdmin",
    "SafeUpdateStackedInline",
    "SafeUpdateTabularInline",
    "request_log_url",
]
