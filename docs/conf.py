"""Sphinx configuration of the django-safeupdates documentation (``make docs``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django
from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# autodoc imports the modules, so Django must be set up; it never connects to a database. Both are set,
# not defaulted, so that a DATABASE_URL of the environment (CI's PostgreSQL) never matters here: an
# in-memory SQLite database needs no driver and no server.
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
os.environ["DATABASE_URL"] = "sqlite://:memory:"
django.setup()

import safeupdates  # noqa: E402  (after django.setup())

project = "django-safeupdates"
author = "django-safeupdates contributors"
copyright = "django-safeupdates contributors"
release = safeupdates.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_title = f"django-safeupdates {release}"


def setup(app: Sphinx) -> None:
    # The HTML examples are Django templates: highlight their {% %} and {{ }} tags as such.
    from pygments.lexers import HtmlDjangoLexer

    app.add_lexer("html", HtmlDjangoLexer)
