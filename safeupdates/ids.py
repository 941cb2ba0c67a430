"""Request ids for events that come with an id of their own (a webhook's event id, a message id).

A provider redelivers a webhook until it gets a 2xx, sometimes more than once after it got one. Passing
``request_id=request_id_for("stripe", event["id"])`` to ``enqueue_update`` or ``update_if_newer``
records every delivery of one event as one request: the second is a duplicate and changes nothing.
"""

from __future__ import annotations

import uuid

from safeupdates.exceptions import InvalidUpdate
from safeupdates.write.validation import has_lone_surrogate, shown

__all__ = ["request_id_for"]

#: The root of the namespaces of :func:`request_id_for`: ``uuid5(NAMESPACE_URL, this package's URL)``.
#: Apart from the namespaces of idempotent tasks and batch items, so an event never takes their ids.
EXTERNAL_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pypi.org/project/django-safeupdates/#external-id")


def request_id_for(namespace_or_source: str | uuid.UUID, external_id: str) -> uuid.UUID:
    """The request id of event ``external_id`` of a source: the same for every delivery of the event.

    ``namespace_or_source`` is a source's name (``"stripe"``, ``"github"``: ids of different sources
    never collide) or a UUID namespace of your own, used as it is: ``uuid5(namespace, external_id)``.
    An empty name or id is refused: it would make every event one request, and drop all but the first.
    """
    if not isinstance(external_id, str) or not external_id.strip():
        raise InvalidUpdate(f"external_id must be a non-empty string (the event's id), got {shown(external_id)}.")
    if isinstance(namespace_or_source, uuid.UUID):
        namespace = namespace_or_source
    elif isinstance(namespace_or_source, str) and namespace_or_source.strip():
        namespace = uuid.uuid5(EXTERNAL_NAMESPACE, _encodable("namespace_or_source", namespace_or_source))
    else:
        raise InvalidUpdate(
            f"namespace_or_source must be a source's name or a uuid.UUID, got {shown(namespace_or_source)}."
        )
    return uuid.uuid5(namespace, _encodable("external_id", external_id))


def _encodable(name: str, text: str) -> str:
    """``text``, refused if uuid5 cannot encode it (UTF-8 takes no lone surrogate)."""
    if has_lone_surrogate(text):
        raise InvalidUpdate(
            f"{name} {shown(text)} contains a lone surrogate (\\ud800 to \\udfff), which no text encoding "
            "can carry; a client's JSON made it of an unpaired \\u escape: refuse or repair it there."
        )
    return text
