"""What a browser would post: the fields of a form in a page, read from its HTML."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any


class _Form(HTMLParser):
    def __init__(self, form_id: str | None) -> None:
        super().__init__(convert_charrefs=True)
        self.form_id = form_id
        self.inside = False
        self.depth = 0
        self.data: list[tuple[str, str]] = []
        self._textarea: str | None = None
        self._select: str | None = None
        self._option: str | None = None
        self._options: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and not self.inside and (self.form_id is None or a.get("id") == self.form_id):
            self.inside = True
            return
        if not self.inside:
            return
        name = a.get("name")
        if tag == "input" and name and a.get("type", "text") not in {"submit", "button", "image", "file"}:
            if a.get("type") in {"checkbox", "radio"}:
                if "checked" in a:
                    self.data.append((name, a.get("value", "on")))
            else:
                self.data.append((name, a.get("value", "")))
        elif tag == "textarea" and name:
            self._textarea = name
            self.data.append((name, ""))
        elif tag == "select" and name:
            self._select, self._options = name, []
        elif tag == "option" and self._select is not None:
            self._options.append((a.get("value", ""), "selected" in a))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            name, value = self.data[-1]
            self.data[-1] = (name, value + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self.inside:
            self.inside = False
        elif tag == "textarea":
            self._textarea = None
        elif tag == "select" and self._select is not None:
            chosen = [v for v, selected in self._options if selected] or [v for v, _ in self._options[:1]]
            self.data += [(self._select, v) for v in chosen]
            self._select = None


def form_data(html: str | bytes, form_id: str | None = None) -> dict[str, Any]:
    """The fields of the form ``form_id`` (the first form if None) as a browser posts them: a dict,
    with a list for names given more than once."""
    parser = _Form(form_id)
    parser.feed(html.decode() if isinstance(html, bytes) else html)
    result: dict[str, Any] = {}
    for name, value in parser.data:
        if name in result:
            result[name] = [*result[name], value] if isinstance(result[name], list) else [result[name], value]
        else:
            result[name] = value
    return result
