"""The one way text is cut short for display (``safeupdates.text.shorten``): a request log column, a job's
description."""

from __future__ import annotations

from safeupdates.text import shorten


def test_a_text_within_the_limit_is_kept_as_it_is():
    assert shorten("", 3) == ""
    assert shorten("abc", 3) == "abc"
    assert shorten("cafe\u0301", 5) == "cafe\u0301"  # never normalized (Truncator would give "café")


def test_a_longer_text_is_cut_to_the_limit_with_an_ellipsis():
    assert shorten("abcd", 3) == "ab…"
    assert shorten("x" * 500, 200) == "x" * 199 + "…"
    assert shorten("e\u0301", 1) == "…"  # code points are counted, a combining one too
