"""Text cut short for display: a job's description, a column of the request log."""

from __future__ import annotations

__all__ = ["shorten"]


def shorten(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and ``…``: never longer
    than ``limit``. Unlike ``django.utils.text.Truncator`` it neither normalizes nor translates: what it
    shows is the text's own code points."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
