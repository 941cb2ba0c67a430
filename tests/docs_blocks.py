"""The fenced code blocks of the documentation (``docs/*.md`` and ``README.md``), as the tests that run
them read them, and a package to import a page's ``<!-- file: toggles/NAME.py -->`` blocks from."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.workers import ROOT

#: The pages: every page of docs/ and the README.
PAGES = ("README.md", *sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md")))

# A block: its fence (``` and an info string; indented in a list item), and the HTML comment right above
# it, if any, which says what the block is (<!-- file: PATH -->, <!-- run -->). A block whose info string
# starts with "{" is a MyST directive (a toctree, eval-rst), not code.
_BLOCK = re.compile(
    r"(?:^[ \t]*<!-- (?P<mark>[^>]*?) -->\n)?"
    r"^(?P<indent>[ \t]*)```(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    mark: str
    body: str

    def __str__(self) -> str:
        first = next((line.strip() for line in self.body.splitlines() if line.strip()), "")
        return f"{self.page}:{self.line} ({self.lang or 'no language'}): {first[:60]}"

    @property
    def file(self) -> str | None:
        """The file a ``<!-- file: PATH -->`` block goes to, else None."""
        return self.mark.removeprefix("file: ").split(" ")[0] if self.mark.startswith("file: ") else None


def blocks(page: str) -> list[Block]:
    """The code blocks of ``page`` (a path relative to the checkout), in order, dedented."""
    text = (ROOT / page).read_text()
    found = []
    for match in _BLOCK.finditer(text):
        lang = match["lang"].strip()
        if lang.startswith("{"):
            continue
        indent = len(match["indent"])
        body = "".join(line[indent:] for line in match["body"].splitlines(keepends=True))
        line = text.count("\n", 0, match.start("indent")) + 1
        found.append(Block(page, line, lang, match["mark"] or "", body))
    return found


def file_blocks(page: str) -> dict[str, str]:
    """The ``<!-- file: PATH -->`` blocks of ``page``: their text by PATH."""
    return {block.file: block.body for block in blocks(page) if block.file is not None}


@contextmanager
def example_package(tmp_path: Path, name: str, files: dict[str, str]) -> Iterator[Path]:
    """A package ``name`` on ``sys.path`` holding ``files`` (name: text) and a ``models`` module that is
    the demo app's (the quick start's ``Profile``), so that a page's ``from .models import Profile``
    imports; forgotten (modules and path) afterwards. Yields its directory."""
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text("from demo_project.toggles.models import Profile  # noqa: F401\n")
    for filename, text in files.items():
        (package / filename).parent.mkdir(parents=True, exist_ok=True)
        (package / filename).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        yield package
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]
