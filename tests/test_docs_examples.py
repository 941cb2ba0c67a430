"""The examples of the documentation run as written."""

from __future__ import annotations

import logging
import logging.config
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from demo_project.toggles.models import Profile
from safeupdates import enqueue_update
from safeupdates.jobs import apply_update
from tests.docs_blocks import Block, blocks
from tests.workers import ROOT


def block_with(page: str, text: str, lang: str = "python") -> Block:
    """The one ``lang`` block of ``page`` that holds ``text``."""
    (found,) = [block for block in blocks(page) if block.lang == lang and text in block.body]
    return found


@pytest.fixture
def safeupdates_logger() -> Iterator[logging.Logger]:
    """The ``safeupdates`` logger, given back as it was after the test configured it (and every other
    logger enabled again if the configuration disabled it)."""
    logger = logging.getLogger("safeupdates")
    state = (logger.handlers[:], logger.level, logger.propagate, logger.filters[:])
    loggers = [other for other in logging.root.manager.loggerDict.values() if isinstance(other, logging.Logger)]
    disabled = {other.name: other.disabled for other in loggers}
    try:
        yield logger
    finally:
        logger.handlers[:], logger.level, logger.propagate, logger.filters[:] = state
        for other in loggers:
            other.disabled = disabled[other.name]


@pytest.mark.django_db(transaction=True)  # the outcome's log line is written after the commit
def test_the_logging_example_prints_each_line_once_with_its_request_id(
    safeupdates_logger: logging.Logger, capsys: Any
) -> None:
    namespace: dict[str, Any] = {}
    exec(block_with("docs/observability.md", "LOGGING = {").body, namespace)
    logging.config.dictConfig(namespace["LOGGING"])
    profile = Profile.objects.create(user=User.objects.create_user("ada"))
    request = enqueue_update(profile, active=True)
    apply_update(str(request.request_id))

    (line,) = [line for line in capsys.readouterr().err.splitlines() if "applied" in line]
    rid = str(request.request_id)
    assert re.fullmatch(
        rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}} INFO \[{rid}\] safeupdates: request {rid} applied: "
        rf"toggles\.Profile pk={profile.pk} version={request.version} fields=active",
        line,
    ), line
    assert not logging.getLogger("django.request").disabled  # Django's loggers still log


def toctree_pages() -> list[str]:
    """The pages of docs/index.md's toctrees, in order, as paths from the checkout."""
    index = (ROOT / "docs" / "index.md").read_text()
    trees = re.findall(r"```\{toctree\}\n(.*?)```", index, re.S)
    names = [line.strip() for tree in trees for line in tree.splitlines() if line.strip() and ":" not in line]
    return ["CHANGELOG.md" if name == "changelog" else f"docs/{name}.md" for name in names]


def test_the_readme_lists_every_page_of_the_docs_in_their_order():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(((?:docs/|CHANGELOG)[^)]*\.md)\)", section)
    assert listed == toctree_pages()
    pages = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")} - {"docs/index.md", "docs/changelog.md"}
    assert pages <= set(toctree_pages())  # Sphinx warns of a page in no toctree, too
