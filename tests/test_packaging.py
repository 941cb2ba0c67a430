"""The wheel, built both ways the README says (``python -m build``: the sdist, then the wheel from it;
``pip wheel``): no setuptools warning, and every file of the package in it (templates, ``py.typed``, the
migrations of every app)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.workers import ROOT

pytestmark = pytest.mark.once  # the same in both passes of make test: it builds, it reads no database

# What a build must not read or write in the checkout: environments, caches, earlier builds, and what a
# test run beside it writes and deletes meanwhile (coverage data files, SQLite databases and journals).
NOT_COPIED = shutil.ignore_patterns(
    ".git",
    ".venv*",
    ".tox",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "mutants",
    "_build",
    "*.sqlite3*",
    ".coverage*",
    ".pytest_cache",
)


BUILDS = {
    "python-m-build": [sys.executable, "-m", "build", "--outdir"],
    "pip-wheel": [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w"],
}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_the_wheel_builds_without_warnings_and_holds_every_file_of_the_package(tmp_path, build):
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=NOT_COPIED)  # a copy: the build writes build/ and *.egg-info
    done = subprocess.run(
        [*BUILDS[build], str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=600
    )
    output = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, output
    # setuptools: "Package 'safeupdates.templates.safeupdates.admin' is absent from the `packages` configuration."
    assert not re.search(r"is absent from the `?packages`? configuration", output), output
    assert "SetuptoolsDeprecationWarning" not in output

    (wheel,) = (tmp_path / "dist").glob("django_safeupdates-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "safeupdates"
    files = {
        path.relative_to(ROOT).as_posix()
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert files - names == set()
    assert {"safeupdates/py.typed", "safeupdates/templates/safeupdates/admin/change_form.html"} <= names
    # pytest loads the fixtures of safeupdates.testing wherever the wheel is installed.
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    declared = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[pytest11]\nsafeupdates.testing = safeupdates.testing\n" in declared
    apps = {path.parent.parent for path in package.rglob("migrations/__init__.py")}
    assert apps == {package, package / "contrib" / "batches"}  # every app with tables
    for app in apps:
        migrations = {path.relative_to(ROOT).as_posix() for path in (app / "migrations").glob("*.py")}
        assert len(migrations) > 1 and migrations <= names
