"""The package's layout, checked where import-linter's contracts (setup.cfg, ``make lint``) cannot say it:
no run-time import cycle, SQL only in ``safeupdates/database/statements.py``, a cursor only in
``safeupdates/database/``, ``django.tasks`` only in ``safeupdates/delivery/``, the request log written only
through ``safeupdates.lifecycle``, Django's and psycopg's internals only behind one module."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "safeupdates"
#: Where hand-written SQL may live. Migrations are history: they keep the SQL they were written with.
SQL_MODULES = {"safeupdates.database.statements"}
SQL = re.compile(
    r"\b(SELECT\s+(\w+|\(|\*)|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|WITH\s+\w+\s+AS|SET\s+LOCAL|nextval\s*\(|"
    r"setval\s*\(|COALESCE\s*\(|json_patch|json_extract|jsonb_\w+|CURRENT_TIMESTAMP|to_regclass)",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {
        module_name(path): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.parts
    }


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(tree: ast.Module, name: str, known: set[str]) -> set[str]:
    """The package's modules that ``tree`` imports, at module level or inside functions (not the imports
    under ``if TYPE_CHECKING:``, which never run)."""
    found: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                todo.extend(child.orelse)
                continue
            todo.append(child)
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = from_module(child, name)
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
    return {module for module in found if module in known and module != name}


def from_module(node: ast.ImportFrom, name: str) -> str:
    """The absolute name of the module that ``from ... import`` in module ``name`` imports from."""
    package = name if _is_package(name) else name.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    return ".".join([*parts[: len(parts) - node.level + 1], node.module or ""]).strip(".")


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / Path(*name.split(".")) / "__init__.py").exists()


def graph() -> dict[str, set[str]]:
    trees = modules()
    return {name: imports(tree, name, set(trees)) for name, tree in trees.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``edges`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_through_function_level_imports():
    tree = ast.parse("def f():\n    from safeupdates import b\n")
    assert imports(tree, "safeupdates.a", {"safeupdates.a", "safeupdates.b"}) == {"safeupdates.b"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_cycle():
    edges = graph()
    assert "safeupdates.write.mixins" in edges["safeupdates.models"]  # the graph sees the package's imports
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


def test_managers_import_nothing_back_from_the_models_that_use_them():
    edges = graph()
    below: set[str] = set()
    todo = ["safeupdates.managers"]
    while todo:
        for target in edges[todo.pop()] - below:
            below.add(target)
            todo.append(target)
    assert not below & {"safeupdates.write.mixins", "safeupdates.models"}, sorted(below)


def sql_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """String literals (and the literal parts of f-strings) that read like SQL; docstrings left out."""
    return [(line, text) for line, text in string_literals(tree) if SQL.search(text)]


def test_the_sql_rule_finds_sql():
    assert sql_literals(ast.parse('x = f"UPDATE {t} SET a = 1"\ny = "SELECT nextval(%s)"'))
    assert not sql_literals(ast.parse('"""Runs SELECT 1 FROM t."""\nx = "select a field"'))


def test_no_sql_outside_the_statements_module():
    offenders = [
        f"{name}:{line}: {text[:80]}"
        for name, tree in modules().items()
        if name not in SQL_MODULES
        for line, text in sql_literals(tree)
    ]
    assert not offenders, "\n".join(offenders)


CONTRIB = re.compile(r"\bsafeupdates\.contrib\b")


def contrib_references(tree: ast.Module, name: str, modules: re.Pattern[str] = CONTRIB) -> list[str]:
    """What in ``tree`` (module ``name``) reaches ``safeupdates.contrib`` (or the ``modules`` named): imports
    at any depth (in functions, under ``if TYPE_CHECKING:``, relative ones), and strings naming such a module
    (what ``importlib.import_module`` or ``import_string`` would load). Docstrings are left out."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if modules.match(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, name)
            found += [f"{base}.{alias.name}" for alias in node.names if modules.match(f"{base}.{alias.name}")]
    found += [text for _, text in string_literals(tree) if modules.search(text)]
    return [f"{name}: {reference}" for reference in found]


def string_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """String literals (and the literal parts of f-strings) of ``tree``, docstrings left out."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.append((node.lineno, node.value))
    return found


def test_the_contrib_rule_finds_every_way_in():
    sources = {
        "def f():\n    from safeupdates.contrib.batches import jobs\n": ["safeupdates.contrib.batches.jobs"],
        "if TYPE_CHECKING:\n    import safeupdates.contrib.controls.jobs\n": ["safeupdates.contrib.controls.jobs"],
        "from .contrib import batches\n": ["safeupdates.contrib.batches"],
        "from . import contrib\n": ["safeupdates.contrib"],
        'import_module("safeupdates.contrib.idempotent.decorators")\n': ["safeupdates.contrib.idempotent.decorators"],
        '"""Docstrings may name safeupdates.contrib."""\nimport safeupdates.jobs\n': [],
    }
    for source, expected in sources.items():
        found = contrib_references(ast.parse(source), "safeupdates.models")
        assert found == [f"safeupdates.models: {module}" for module in expected], source


def test_the_core_never_imports_contrib():
    """The core write path can be adopted without the job tools: nothing outside ``safeupdates/contrib/``
    imports them or names them (tests/test_core_alone.py checks the same at run time, in a project without
    them)."""
    core = {name: tree for name, tree in modules().items() if not CONTRIB.match(name)}
    assert "safeupdates.jobs" in core
    offenders = [reference for name, tree in core.items() for reference in contrib_references(tree, name)]
    assert not offenders, "\n".join(offenders)


#: The one module that writes a request's status (DESIGN: "Nothing else writes status").
LIFECYCLE_MODULE = "safeupdates.lifecycle"
_WRITES = {"update", "create", "bulk_create", "bulk_update", "update_or_create", "get_or_create"}


def status_writes(tree: ast.Module) -> list[tuple[int, str]]:
    """Writes of a request's ``status``: a ``status=`` keyword of a write call (``update()``, ``create()``
    ...) or of a model constructor, an assignment to ``.status``, and SQL that names request statuses.
    The batches' own ``Batch.status`` (values of ``BatchStatus``) is the batch's, not a request's."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            # A model's constructor writes what it is given; a response's status is HTTP, a Q() reads.
            constructor = name[:1].isupper() and name != "Q" and not name.endswith("Response")
            if name in _WRITES or constructor:
                for keyword in node.keywords:
                    if keyword.arg == "status" and "BatchStatus" not in ast.unparse(keyword.value):
                        found.append((node.lineno, ast.unparse(node)[:80]))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "status":
                    found.append((node.lineno, ast.unparse(node)[:80]))
    for line, text in sql_literals(tree):
        if re.search(r"'(pending|applied|stale|rejected|failed)'", text):
            found.append((line, text[:80]))
    return found


def test_the_status_rule_finds_status_writes():
    source = (
        "log.filter(pk=1).update(status=RequestStatus.FAILED)\n"
        "ProcessedRequest(status='applied')\n"
        "record.status = 'stale'\n"
        "sql = \"UPDATE log SET status = 'applied' WHERE id = %s\"\n"
    )
    assert sorted(line for line, _text in status_writes(ast.parse(source))) == [1, 2, 3, 4]
    reads = "log.filter(status=RequestStatus.PENDING).exists()\nBatch.objects.update(status=BatchStatus.DONE)\n"
    assert status_writes(ast.parse(reads)) == []


def test_only_the_lifecycle_module_writes_a_requests_status():
    """Every transition of a request-log row goes through safeupdates.lifecycle: the job path, the manager,
    the relay's revival and the optional job tools call it."""
    offenders = [
        f"{name}:{line}: {text}"
        for name, tree in modules().items()
        if name != LIFECYCLE_MODULE
        for line, text in status_writes(tree)
    ]
    assert not offenders, "\n".join(offenders)


#: The one module that reaches below Django's and psycopg's public API (DESIGN: "Django internals are used
#: only behind one version-aware seam, tested on every supported version").
INTERNALS_MODULE = "safeupdates.database.internals"
#: Modules below the public API, and the private state of Django's ``Collector``.
PRIVATE_MODULES = re.compile(
    r"^(django\.db\.models\.(deletion|sql)|django\.db\.backends\.(postgresql|sqlite3|mysql|oracle)\b|psycopg\b)"
)
COLLECTOR_STATE = {"data", "fast_deletes", "field_updates", "can_fast_delete", "dependencies", "sort"}


def private_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """Imports from a module below Django's or psycopg's public API or of a private name, and uses of a
    ``Collector``'s state (an attribute of a name called ``collector``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            private_name = any(alias.name.startswith("_") for alias in node.names)
            if PRIVATE_MODULES.match(node.module) or (node.module.startswith(("django", "psycopg")) and private_name):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, ast.unparse(node)) for alias in node.names if PRIVATE_MODULES.match(alias.name))
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in COLLECTOR_STATE
            and isinstance(node.value, ast.Name)
            and node.value.id == "collector"
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_internals_rule_finds_private_uses():
    source = (
        "from django.db.models.deletion import Collector\n"
        "from django.db.models.sql import UpdateQuery\n"
        "import psycopg\n"
        "from django.db.backends.postgresql.base import DatabaseWrapper\n"
        "from django.db.models.base import _save_table\n"
        "collector.fast_deletes = []\n"
        "keys = list(collector.data)\n"
    )
    assert [line for line, _text in private_uses(ast.parse(source))] == [1, 2, 3, 4, 5, 6, 7]
    public = (
        "from django.db import models, transaction\nfrom django.db.models.signals import pre_delete\n"
        "from django.db.backends.base.base import BaseDatabaseWrapper\nx.data\n"
    )
    assert private_uses(ast.parse(public)) == []


def test_only_the_internals_module_reaches_below_the_public_api():
    offenders = [
        f"{name}:{line}: {text}"
        for name, tree in modules().items()
        if name != INTERNALS_MODULE
        for line, text in private_uses(tree)
    ]
    assert not offenders, "\n".join(offenders)


#: The hooks of Django's that the package overrides: the only private names used outside the internals
#: module, each where it is overridden (and ``super()`` called). DRF's ``Request._request`` (the
#: ``HttpRequest`` it wraps, as DRF's docs name it) shares its name with Django private attributes.
OVERRIDDEN_HOOKS = {
    "safeupdates.write.mixins": {"_do_update", "_do_insert"},
    "safeupdates.forms": {"_post_clean"},
    "safeupdates.contrib.drf": {"_request"},
}
#: Private names Django documents for use (the model API's ``_meta``, ``_state`` and managers).
DOCUMENTED_PRIVATE = {"_meta", "_state", "_default_manager", "_base_manager"}


@functools.cache
def private_names_of(*packages: str) -> frozenset[str]:
    """The private names (one leading underscore) that the installed ``packages`` define: functions,
    classes, attributes and variables, as their source names them."""
    names: set[str] = set()
    for package in packages:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None
        for path in Path(spec.origin).parent.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = node.name
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    name = node.id
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    name = node.attr
                else:
                    continue
                if name.startswith("_") and not name.startswith("__"):
                    names.add(name)
    return frozenset(names - DOCUMENTED_PRIVATE)


def private_attributes(tree: ast.Module, theirs: frozenset[str]) -> list[tuple[int, str]]:
    """Where ``tree`` reads a private name of ``theirs`` off an object (``x._db``, ``super()._do_update``,
    ``getattr(x, "_committed")``); its own ``self._name`` and ``cls._name`` are its own."""
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and node.attr in theirs:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in theirs
        ):
            name = node.args[1].value
        if name is not None:
            found.append((node.lineno, name))
    return sorted(found)


def test_the_private_name_rule_finds_private_attributes():
    theirs = private_names_of("django", "psycopg")
    assert {"_thread_ident", "_db", "_committed", "_bounds", "_do_update", "_wrapped"} <= theirs
    source = (
        "connection._thread_ident\n"
        "getattr(queryset, '_db', None)\n"
        "super()._do_update(1)\n"
        "settings._wrapped\n"
        "self._db\n"
        "instance._meta\n"
    )
    assert private_attributes(ast.parse(source), theirs) == [
        (1, "_thread_ident"),
        (2, "_db"),
        (3, "_do_update"),
        (4, "_wrapped"),
    ]


def test_only_the_internals_module_uses_private_names_of_django_and_psycopg():
    """docs/architecture.md: Django's and psycopg's private API only in ``database/internals.py``, but the
    hooks the package overrides."""
    theirs = private_names_of("django", "psycopg")
    offenders = [
        f"{name}:{line}: {attribute}"
        for name, tree in modules().items()
        if name != INTERNALS_MODULE
        for line, attribute in private_attributes(tree, theirs)
        if attribute not in OVERRIDDEN_HOOKS.get(name, set())
    ]
    assert not offenders, "\n".join(offenders)


#: The wing that runs statements (DESIGN: "database/, the only place that opens a cursor").
DATABASE_WING = "safeupdates.database"


def cursor_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """Where ``tree`` opens a cursor (``x.cursor()``, ``statement_cursor(...)``) or runs a statement on one
    (``<a cursor>.execute(...)``, ``executemany``, ``fetchone`` ...): a Redis pipeline's ``execute()`` is
    not a cursor's."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if name in ("cursor", "statement_cursor") or (
            name in ("execute", "executemany", "fetchone", "fetchall", "fetchmany") and "cursor" in receiver.lower()
        ):
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_the_cursor_rule_finds_cursors():
    source = (
        "with connection.cursor() as cursor:\n    cursor.execute(sql)\n    row = cursor.fetchone()\n"
        "with statement_cursor(connection) as c:\n    pass\n"
    )
    assert [line for line, _text in cursor_uses(ast.parse(source))] == [1, 2, 3, 4]
    assert cursor_uses(ast.parse("pipe.execute()\nasked.execute()[1:]\nfetch_one(connection, sql)\n")) == []


def test_only_the_database_wing_opens_a_cursor():
    """Every statement of the package runs through ``safeupdates.database.cursors``: one place to see how
    a statement runs (prepared or not), and to time, log or trace it."""
    offenders = [
        f"{name}:{line}: {text}"
        for name, tree in modules().items()
        if not (name == DATABASE_WING or name.startswith(f"{DATABASE_WING}."))
        for line, text in cursor_uses(tree)
    ]
    assert not offenders, "\n".join(offenders)


#: The one wing that imports Django's Tasks framework (import-linter names external packages by their
#: root, so ``django.tasks``, a part of ``django``, is checked here; the backport ``django_tasks`` is in
#: the contract too).
DELIVERY_WING = "safeupdates.delivery"


def tasks_imports(tree: ast.Module, name: str) -> list[str]:
    """Imports of ``django.tasks`` (or the backport ``django_tasks``) in ``tree``, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith(("django.tasks", "django_tasks"))]
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module
            and (
                node.module.startswith(("django.tasks", "django_tasks"))
                or (node.module == "django" and any(alias.name == "tasks" for alias in node.names))
            )
        ):
            found.append(node.module)
    return [f"{name}: {module}" for module in found]


def test_the_tasks_rule_finds_every_way_in():
    sources = ["from django.tasks import task\n", "import django_tasks\n", "from django import tasks\n"]
    assert [len(tasks_imports(ast.parse(source), "m")) for source in sources] == [1, 1, 1]
    assert tasks_imports(ast.parse("from django.db import models\n"), "m") == []


def test_only_the_delivery_wing_imports_djangos_tasks_framework():
    offenders = [
        reference
        for name, tree in modules().items()
        if not name.startswith(f"{DELIVERY_WING}.") and name != DELIVERY_WING
        for reference in tasks_imports(tree, name)
    ]
    assert not offenders, "\n".join(offenders)


#: The modules above the seam that reach a delivery backend only through it: the system checks ask
#: ``delivery.check()`` and the app's start-up ``delivery.ready()``; each backend holds its own.
THROUGH_THE_SEAM = ("safeupdates.checks", "safeupdates.apps")


def backend_modules() -> re.Pattern[str]:
    """The modules of the delivery wing but its seam (``safeupdates.delivery.rq``, ``.tasks`` ...)."""
    names = sorted(name.rpartition(".")[2] for name in modules() if name.startswith(f"{DELIVERY_WING}."))
    assert {"rq", "rq_worker", "tasks", "celery"} <= set(names)
    return re.compile(rf"\b{re.escape(DELIVERY_WING)}\.({'|'.join(names)})\b")


def test_the_backend_rule_finds_every_way_in():
    sources = {
        "def f():\n    from safeupdates.delivery.rq import queue_problem\n": ["safeupdates.delivery.rq.queue_problem"],
        "from safeupdates.delivery import tasks as taskqueue\n": ["safeupdates.delivery.tasks"],
        "from .delivery import rq_worker\n": ["safeupdates.delivery.rq_worker"],
        'import_module("safeupdates.delivery.celery")\n': ["safeupdates.delivery.celery"],
        "from safeupdates import delivery\nfrom safeupdates.delivery import BACKENDS, backend\n": [],
    }
    for source, expected in sources.items():
        found = contrib_references(ast.parse(source), "safeupdates.checks", backend_modules())
        assert found == [f"safeupdates.checks: {module}" for module in expected], source


def test_the_checks_and_the_start_up_reach_the_backends_through_the_seam():
    """A new backend is one module and a line in ``delivery.BACKENDS``: no check and no start-up of one
    lives outside its module."""
    trees = modules()
    offenders = [
        reference for name in THROUGH_THE_SEAM for reference in contrib_references(trees[name], name, backend_modules())
    ]
    assert not offenders, "\n".join(offenders)


#: What writes rows of a model: the request log's rows are created, changed and deleted only through the
#: methods of its QuerySet (safeupdates.lifecycle), whose own writes this rule does not read.
_LOG_WRITES = {"bulk_create", "create", "update", "bulk_update", "update_or_create", "get_or_create", "delete", "save"}


def request_log_writes(tree: ast.Module) -> list[tuple[int, str]]:
    """Writes of request-log rows that bypass the lifecycle: a write method called on an expression that
    names ``ProcessedRequest``, or on a name assigned from one (``log = ProcessedRequest.objects...``)."""
    tainted = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and "ProcessedRequest" in ast.unparse(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LOG_WRITES:
            receiver = ast.unparse(node.func.value)
            root = receiver.split(".")[0].split("(")[0]
            if "ProcessedRequest" in receiver or root in tainted:
                found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_the_request_log_rule_finds_writes():
    source = (
        "log = ProcessedRequest.objects.using(alias)\n"
        "log.bulk_create([ProcessedRequest(key=k)], ignore_conflicts=True)\n"
        "ProcessedRequest.objects.filter(pk=1).update(error='')\n"
        "log.filter(pk=1).delete()\n"
        "log.create_pending_rows([row], kind=kind)\n"
        "Batch.objects.create(total=1)\n"
    )
    assert [line for line, _text in request_log_writes(ast.parse(source))] == [2, 3, 4]


def test_contrib_writes_the_request_log_only_through_the_lifecycle():
    """Every status a request-log row ever has, its first included, is written in safeupdates.lifecycle:
    the job tools create their rows with ``create_pending_rows()`` and end them with ``complete()``."""
    offenders = [
        f"{name}:{line}: {text}"
        for name, tree in modules().items()
        if CONTRIB.match(name)
        for line, text in request_log_writes(tree)
    ]
    assert not offenders, "\n".join(offenders)


#: Where a model's default manager is read on purpose: the records a view serves (``conditional(queryset=
#: Model)``) are the user-facing set, as Django's generic views read them. Every internal read of a record
#: goes through ``_base_manager``, Django's own rule: a default manager may hide rows (soft delete, a tenant).
DEFAULT_MANAGER_READS = {"safeupdates.http"}


def default_manager_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """Reads through a model's default manager: ``_default_manager``, and ``.objects`` of a model held in a
    variable (``model.objects``, ``self.model.objects``); ``ProcessedRequest.objects`` names a table of the
    app's own, whose manager hides nothing."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        receiver = node.value
        name = (
            receiver.id
            if isinstance(receiver, ast.Name)
            else receiver.attr
            if isinstance(receiver, ast.Attribute)
            else ""
        )
        if node.attr == "_default_manager" or (node.attr == "objects" and name[:1].islower()):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_default_manager_rule_finds_its_reads():
    source = (
        "model._default_manager.filter(pk=1)\n"
        "self.model.objects.get(pk=1)\n"
        "type(instance)._default_manager.all()\n"
        "ProcessedRequest.objects.filter(pk=1)\n"
        "model._base_manager.filter(pk=1)\n"
        "request_log().objects.using(alias)\n"
    )
    assert [line for line, _text in default_manager_reads(ast.parse(source))] == [1, 2, 3]


def test_internal_reads_of_a_record_use_the_base_manager():
    offenders = [
        f"{name}:{line}: {text}"
        for name, tree in modules().items()
        if name not in DEFAULT_MANAGER_READS
        for line, text in default_manager_reads(tree)
    ]
    assert not offenders, "\n".join(offenders)
