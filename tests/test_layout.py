"""The package's layout, checked: a one-way import graph, and SQL only in ``safeupdates/statements.py``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "safeupdates"
#: Where hand-written SQL may live. Migrations are history: they keep the SQL they were written with.
SQL_MODULES = {"safeupdates.statements"}
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
                package = name if tree is not None and _is_package(name) else name.rpartition(".")[0]
                base = child.module or ""
                if child.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - child.level + 1], base]).strip(".")
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
    return {module for module in found if module in known and module != name}


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
    assert "safeupdates.base" in edges["safeupdates.models"]  # the graph sees the package's imports
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


def test_managers_import_nothing_back_from_the_models_that_use_them():
    edges = graph()
    below: set[str] = set()
    todo = ["safeupdates.managers"]
    while todo:
        for target in edges[todo.pop()] - below:
            below.add(target)
            todo.append(target)
    assert not below & {"safeupdates.base", "safeupdates.models"}, sorted(below)


def sql_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """String literals (and the literal parts of f-strings) that read like SQL; docstrings left out."""
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
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        else:
            continue
        if SQL.search(text):
            found.append((node.lineno, text))
    return found


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


def test_the_old_import_paths_of_the_job_tools_still_work():
    """Jobs already queued name ``safeupdates.batches.run_batch_item`` ...: those paths must import."""
    from rq.utils import import_attribute

    import safeupdates
    import safeupdates.models
    from safeupdates.contrib.batches import jobs as batches
    from safeupdates.contrib.batches import models
    from safeupdates.contrib.controls import jobs as controls
    from safeupdates.contrib.idempotent import decorators

    for name in ("run_batch_item", "run_batch_reduce", "fan_out", "relay_batches"):
        assert import_attribute(f"safeupdates.batches.{name}") is getattr(batches, name)
    for name in ("controlled_call", "reap_if_abandoned", "enqueue"):
        assert import_attribute(f"safeupdates.controls.{name}") is getattr(controls, name)
    assert import_attribute("safeupdates.idempotency.idempotent") is decorators.idempotent
    assert (safeupdates.fan_out, safeupdates.enqueue, safeupdates.idempotent) == (
        batches.fan_out,
        controls.enqueue,
        decorators.idempotent,
    )
    assert (safeupdates.models.Batch, safeupdates.models.BatchStatus) == (models.Batch, models.BatchStatus)


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
