"""Every fenced code block of ``docs/*.md`` and ``README.md`` runs in a test, or is listed here with
the reason it cannot run by itself (:data:`NOT_RUN`): a new block that no test runs fails
:func:`test_every_block_is_run_by_a_test`.

How each kind of block is run:

- **python** (and the quick start's **html**): a page's ``<!-- file: PATH -->`` blocks by the page's own
  test (:data:`OWNERS`), which writes them into a project and drives them; the README's quick start by
  ``tests/test_quickstart.py``, as blocks of the guide. Every other Python block is executed here, the
  blocks of a page in order in one namespace, as a reader would paste them, with the names the text
  around them takes as given (:func:`readers_names`: a ``Profile`` and a saved ``profile``, a job
  function ...). A block that assigns settings is checked as settings: ``SAFEUPDATES_*`` names that
  safeupdates reads, apps that import, queues and task backends that can be built.
- **console** / **sh**: each command is a command of this project (:func:`unrecognised`): a
  ``manage.py`` command that exists and takes the arguments shown, a ``make`` target and its variables,
  ``pip install`` of this project and its extras, a script or module of the checkout and its options.
- **json**: parsed; **yaml** (Prometheus rules): the metrics they query are safeupdates'; (a Kubernetes
  probe): its commands are this project's; **ini**: a
  systemd unit parses and starts a command of this project, and PostgreSQL settings are set on
  PostgreSQL; **sql**: run on PostgreSQL.
- **text**: program output and diagrams, not code (the output of ``safeupdates_relay --retry-failed`` is
  compared by ``tests/test_deployment_docs.py``, the outcome log lines below).
"""

from __future__ import annotations

import configparser
import importlib
import importlib.util
import json
import logging
import logging.config
import re
import shlex
import sys
import types
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import django
import django_rq
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, get_commands, load_command_class
from django.db import connection, transaction
from django.urls import include, path
from django.utils.module_loading import import_string

import safeupdates
from demo_project.toggles.models import Profile
from safeupdates import enqueue_update
from safeupdates.contrib.idempotent.decorators import idempotent
from safeupdates.jobs import apply_update
from safeupdates.signals import request_applied
from safeupdates.testing import run_pending
from tests.docs_blocks import PAGES, Block, blocks
from tests.workers import ROOT

#: Blocks that cannot run by themselves: (page, the block's first line) and why.
NOT_RUN: dict[tuple[str, str], str] = {}

#: The pages whose ``<!-- file: PATH -->`` blocks a test of their own writes into a project and runs:
#: the test, and the files it runs (each of those tests asserts this same list of the page's files).
OWNERS: dict[str, tuple[str, set[str]]] = {
    "docs/quickstart.md": ("tests/test_quickstart.py", {"*"}),
    "docs/http.md": ("tests/test_http_docs.py", {"toggles/api.py", "toggles/api_drf.py"}),
    "docs/admin.md": ("tests/test_admin_docs.py", {"toggles/admin.py", "toggles/forms.py"}),
    "docs/delivery.md": ("tests/test_celery_docs.py", {"proj/celery.py", "proj/__init__.py", "proj/settings.py"}),
    "docs/testing-your-project.md": (
        "tests/test_testing_plugin.py",
        {"mysite/test_settings.py", "pytest.ini", "toggles/tests.py", "toggles/test_pending.py"},
    ),
}

CODE = {"python", "html"}
COMMANDS = {"console", "sh"}
DATA = {"json", "yaml", "ini", "sql"}
OUTPUT = {"text"}

ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def owner(block: Block) -> str | None:
    """The test that runs ``block`` as a file of a project, if one does: its page's, or for a Python
    block that stands whole in one of the quick start's files (the README's quick start, a function
    quoted elsewhere), the quick start's."""
    guide = [b.body for b in blocks("docs/quickstart.md") if b.file is not None]
    if block.lang == "python" and block.file is None and any(block.body in text for text in guide):
        return "tests/test_quickstart.py (a part of the guide's files)"
    test, files = OWNERS.get(block.page, ("", set()))
    if block.file is not None and ("*" in files or block.file in files):
        return test
    return None


def key(block: Block) -> tuple[str, str]:
    return (block.page, next(line.strip() for line in block.body.splitlines() if line.strip()))


def test_every_block_is_run_by_a_test():
    """Each block is of a kind a test here runs, or is run by its page's test, or is listed in NOT_RUN;
    and NOT_RUN names only blocks that are there."""
    unrun = [
        str(block)
        for block in ALL_BLOCKS
        if key(block) not in NOT_RUN
        and not (block.lang in CODE and (owner(block) or block.lang == "python"))
        and block.lang not in COMMANDS | DATA | OUTPUT
    ]
    assert unrun == []
    assert set(NOT_RUN) <= {key(block) for block in ALL_BLOCKS}
    # The blocks a page's own test runs are exactly those its list names.
    for page, (_test, files) in OWNERS.items():
        if "*" not in files:
            assert {b.file for b in blocks(page) if b.file is not None} == files, page
    assert all(b.mark.startswith(("file: ", "run")) for b in blocks("docs/quickstart.md") if b.lang in CODE)


def test_the_blocks_are_found():
    """The reader of the blocks finds them all: each page's fences, none left unread."""
    for page in PAGES:
        text = (ROOT / page).read_text()
        fences = len(re.findall(r"^[ \t]*```", text, re.M))
        assert fences == 2 * len(blocks(page)) + 2 * text.count("```{"), page
    assert len(ALL_BLOCKS) >= 80


# -- python: executed, a page's blocks in order in one namespace ---------------------------------------


#: The calls of the job functions below, as the jobs that the pages enqueue run them.
CALLED: list[tuple[str, tuple[Any, ...]]] = []


# Job functions the pages enqueue by reference: defined at module level, so that a worker can import them.
def rebuild_search_index(user_pk: int) -> None:
    CALLED.append(("rebuild_search_index", (user_pk,)))


def post_ledger_entry(account_pk: int, entry_pk: int) -> None:
    CALLED.append(("post_ledger_entry", (account_pk, entry_pk)))


def push_to_partner(order_pk: int) -> None:
    CALLED.append(("push_to_partner", (order_pk,)))


def send_welcome_email(user_pk: int) -> None:
    CALLED.append(("send_welcome_email", (user_pk,)))


def transcode_video(video_pk: int) -> None:
    CALLED.append(("transcode_video", (video_pk,)))


def compute_item_stats(item_id: int) -> None:
    CALLED.append(("compute_item_stats", (item_id,)))


def reduce_report(batch_id: str) -> None:
    CALLED.append(("reduce_report", (batch_id,)))


@pytest.fixture
def readers_names(redis: Any) -> Iterator[dict[str, Any]]:
    """What the text around the Python blocks takes as given: the quick start's ``Profile`` (also as
    ``toggles.models``) and a saved ``profile``, its ``pk`` and ``user``, the project's settings so far,
    your own objects and job functions (``reports.jobs`` too), ``notify_user`` (it records its calls),
    and the names a block uses from a page's earlier text (``task``, ``idempotent``, ``path``)."""
    if django.VERSION >= (6, 0):
        from django.tasks import task
    else:
        from django_tasks import task
    import demo_project.toggles
    import demo_project.toggles.models

    user = User.objects.create_user("reader")
    profile = Profile.objects.create(user=user)
    reports = types.ModuleType("reports")
    reports_jobs = types.ModuleType("reports.jobs")
    for function in (compute_item_stats, reduce_report):
        setattr(reports_jobs, function.__name__, function)
    aliases = {
        "toggles": demo_project.toggles,
        "toggles.models": demo_project.toggles.models,
        "reports": reports,
        "reports.jobs": reports_jobs,
    }
    notified: list[Any] = []
    names = {
        "__name__": "docs_example",
        "Profile": Profile,
        "profile": profile,
        "pk": profile.pk,
        "user": user,
        "User": User,
        "Decimal": Decimal,
        "INSTALLED_APPS": list(settings.INSTALLED_APPS),
        "REDIS_URL": settings.REDIS_URL,
        "env": lambda name: f"the value of {name}",
        "path": path,
        "include": include,
        "task": task,
        "idempotent": idempotent,
        "notify_user": notified.append,
        "notified": notified,
        "account": types.SimpleNamespace(pk=3),
        "entry": types.SimpleNamespace(pk=4),
        "order": types.SimpleNamespace(pk=5),
        "video": types.SimpleNamespace(pk=6),
        "item_ids": [1, 2, 3],
        **{f.__name__: f for f in (rebuild_search_index, post_ledger_entry, push_to_partner)},
        **{f.__name__: f for f in (send_welcome_email, transcode_video)},
    }
    saved = {name: sys.modules.get(name) for name in aliases}
    sys.modules.update(aliases)
    try:
        yield names
    finally:
        for name, module in saved.items():
            if module is None:
                del sys.modules[name]
            else:
                sys.modules[name] = module


def the_receiver_example_runs(namespace: dict[str, Any]) -> None:
    """docs/observability.md's receiver is called for an applied change of ``active`` (then let go)."""
    try:
        enqueue_update(namespace["profile"], active=True)
        run_pending()
        assert namespace["notified"] == [namespace["profile"].pk]
    finally:
        request_applied.disconnect(namespace["push_to_browser"], sender=Profile)


def the_jobs_enqueued_run(namespace: dict[str, Any]) -> None:
    """The jobs docs/controls.md enqueued run, here (RQ's SimpleWorker), each with the arguments shown:
    none fails, the fan-out's reduce runs once, after its items."""
    import signal

    from rq import SimpleWorker

    CALLED.clear()
    queues = [django_rq.get_queue(name) for name in settings.RQ_QUEUES]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        SimpleWorker(queues, connection=queues[0].connection).work(burst=True)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert [queue.failed_job_registry.count for queue in queues] == [0] * len(queues)
    user = namespace["user"].pk
    reduce = ("reduce_report", (str(namespace["batch"].batch_id),))
    assert sorted(CALLED) == sorted(
        [
            ("rebuild_search_index", (user,)),
            ("post_ledger_entry", (3, 4)),
            ("push_to_partner", (5,)),
            ("send_welcome_email", (user,)),
            ("transcode_video", (6,)),
            *[("compute_item_stats", (item,)) for item in namespace["item_ids"]],
            reduce,
        ]
    )
    # The reduce after every item (the slow queue's job may run after it: the worker takes its queues in turn).
    assert CALLED.index(reduce) > max(CALLED.index(("compute_item_stats", (item,))) for item in namespace["item_ids"])


#: What is checked once a page's blocks ran, beyond that they ran: page -> check of the namespace.
AFTER: dict[str, Callable[[dict[str, Any]], None]] = {
    "docs/observability.md": the_receiver_example_runs,
    "docs/controls.md": the_jobs_enqueued_run,
}


def executed_here(block: Block) -> bool:
    return block.lang == "python" and owner(block) is None and key(block) not in NOT_RUN


def safeupdates_settings() -> set[str]:
    """The ``SAFEUPDATES_*`` settings the package reads."""
    sources = (path.read_text() for path in (ROOT / "safeupdates").rglob("*.py"))
    return {name for source in sources for name in re.findall(r"\bSAFEUPDATES_[A-Z_]+\b", source)}


def assigned_settings(block: Block, namespace: dict[str, Any]) -> dict[str, Any]:
    """The upper-case names ``block`` assigns at its top level (settings, or a helper such as SENTINEL)."""
    import ast

    names: set[str] = set()
    for node in ast.parse(block.body).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}
    return {name: namespace[name] for name in sorted(names)}


def app_imports(app: Any) -> bool:
    """Whether an entry of INSTALLED_APPS imports: a module, or an AppConfig by its path (``...`` stands for
    the entries a page leaves out)."""
    if app is Ellipsis:
        return True
    try:
        if importlib.util.find_spec(app) is not None:
            return True
    except ModuleNotFoundError:
        pass
    try:
        import_string(app)
    except ImportError:
        return False
    return True


def settings_problems(assigned: dict[str, Any]) -> list[str]:
    """What is wrong with settings as a block assigns them: an unknown SAFEUPDATES_ setting, an app that
    does not import, a queue django-rq cannot connect to, a task backend that does not import."""
    from django_rq.connection_utils import get_redis_connection

    problems = []
    for name, value in assigned.items():
        if name.startswith("SAFEUPDATES_") and name not in safeupdates_settings():
            problems.append(f"{name} is no setting of safeupdates")
        elif name == "INSTALLED_APPS":
            problems += [f"INSTALLED_APPS: {app} does not import" for app in value if not app_imports(app)]
        elif name == "RQ_QUEUES":
            for queue, config in value.items():
                try:
                    get_redis_connection(config)
                except Exception as exc:
                    problems.append(f"RQ_QUEUES[{queue!r}]: {exc!r}")
        elif name == "TASKS":
            for alias, config in value.items():
                try:
                    import_string(config["BACKEND"])
                except ImportError as exc:
                    problems.append(f"TASKS[{alias!r}]: {exc}")
    return problems


# Transactional: what a page enqueues on commit (a fan-out's jobs) is enqueued, and its jobs can run.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", sorted({block.page for block in ALL_BLOCKS if executed_here(block)}))
def test_the_python_blocks_of_the_page_run(page: str, readers_names: dict[str, Any]) -> None:
    namespace = dict(readers_names)
    for block in [block for block in blocks(page) if executed_here(block)]:
        try:
            exec(compile(block.body, str(block), "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{block} fails: {exc!r}") from exc
        assert settings_problems(assigned_settings(block, namespace)) == [], str(block)
    if page in AFTER:
        AFTER[page](namespace)


def test_the_settings_check_finds_bad_settings():
    assert settings_problems(
        {
            "SAFEUPDATES_QUEUES": "default",
            "SAFEUPDATES_QUEUE": "default",
            "INSTALLED_APPS": [..., "safeupdates", "safeupdates.contrib.nothing", "django_rq"],
            "RQ_QUEUES": {"default": {"URL": "not a url"}},
            "TASKS": {"default": {"BACKEND": "django_tasks_db.NoBackend"}},
        }
    ) == [
        "SAFEUPDATES_QUEUES is no setting of safeupdates",
        "INSTALLED_APPS: safeupdates.contrib.nothing does not import",
        "RQ_QUEUES['default']: ValueError('Redis URL must specify one of the following schemes "
        "(redis://, rediss://, unix://)')",
        'TASKS[\'default\']: Module "django_tasks_db" does not define a "NoBackend" attribute/class',
    ]


# -- console / sh: commands of this project --------------------------------------------------------------


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a console block, each as its words: comments, line continuations, environment
    assignments and redirections aside, split at ``;``, ``&`` and ``|``. In a block with ``$ `` prompts
    only those lines are commands (the others are output)."""
    lines = body.splitlines()
    if any(line.startswith("$ ") for line in lines):
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    statements, pending = [], ""
    for line in "\n".join(lines).replace("\\\n", " ").splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            lexer = shlex.shlex(pending, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:  # a quotation that goes on on the next line
            continue
        statements.append(words)
        pending = ""
    assert not pending, f"unclosed quotation: {pending!r}"
    commands = []
    for words in statements:
        command: list[str] = []
        for word in [*words, ";"]:
            if word in (";", "&", "&&", "|", "||"):
                if command:
                    commands.append(command)
                command = []
            elif command and command[-1] in (">", ">>", "<"):
                command.pop()  # a redirection and its file
            elif command or not re.match(r"^[A-Z_][A-Z0-9_]*=", word):
                command.append(word)
    return commands


def readable(words: list[str]) -> list[str]:
    """Words as a reader fills them in: ``[--option value]`` and ``[app_label.Model ...]`` are optional
    parts, given here; ``...`` stands for more of the same."""
    return [word.strip("[]") for word in words if word.strip("[]") not in ("", "...")]


def manage_command(words: list[str]) -> str | None:
    """Why ``manage.py <words>`` is not a command of this project (or None): a command that exists in it
    (with every app of the docs installed, as in the tests) and parses the arguments shown."""
    name, args = words[0], readable(words[1:])
    commands = get_commands()
    if name not in commands:
        return f"no manage.py command {name!r}"
    command = load_command_class(commands[name], name)
    try:
        command.create_parser("manage.py", name).parse_args(args)
    except CommandError as exc:
        return f"manage.py {name}: {exc}"
    return None


def options_of(source: Path, words: list[str]) -> str | None:
    """Why a script or module of the checkout does not take the options shown (or None): each ``--option``
    is a string of its source."""
    text = source.read_text()
    unknown = [w.split("=")[0] for w in words if w.startswith("--") and f'"{w.split("=")[0]}"' not in text]
    return f"{source.relative_to(ROOT)} has no option {unknown}" if unknown else None


def python_command(words: list[str]) -> str | None:
    if words[:1] == ["manage.py"]:
        return manage_command(words[1:])
    if words[:1] == ["-m"]:
        module = words[1]
        source = ROOT / (module.replace(".", "/") + ".py")
        if source.exists():
            return options_of(source, words[2:])
        return None if importlib.util.find_spec(module) else f"python -m {module}: no such module"
    script = ROOT / words[0]
    return options_of(script, words[1:]) if script.is_file() else f"python {words[0]}: no such script"


def make_command(words: list[str]) -> str | None:
    """Why ``make <words>`` is not a target of the Makefile with variables it reads (or None)."""
    makefile = (ROOT / "Makefile").read_text()
    targets = [w for w in words if "=" not in w]
    variables = [w.split("=")[0] for w in words if "=" in w]
    problems = [f"no make target {t!r}" for t in targets if not re.search(rf"^{re.escape(t)}:", makefile, re.M)]
    problems += [f"make reads no variable {v}" for v in variables if f"$({v})" not in makefile]
    return "; ".join(problems) or None


def pip_install(words: list[str]) -> str | None:
    """Why ``pip install <words>`` does not install this project (or None): a checkout of it, its
    wheel of this version, with extras it has."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = set(config["options.extras_require"])
    wheel = f"dist/django_safeupdates-{safeupdates.__version__}-py3-none-any.whl"
    problems = []
    for word in words:
        if word.startswith("-"):
            continue
        name, _, rest = word.partition("[")
        wanted = set(rest.rstrip("]").split(",")) - {""}
        if not (name.endswith("django-safeupdates") or name == wheel):
            problems.append(f"pip install {word}: not this project")
        if wanted - extras:
            problems.append(f"pip install {word}: no extra {sorted(wanted - extras)}")
    return "; ".join(problems) or None


def tool(name: str) -> bool:
    """A tool the project installs: in one of its requirements files."""
    requirements = "".join(path.read_text() for path in ROOT.glob("requirements*.txt"))
    return re.search(rf"^{re.escape(name)}\b", requirements, re.M | re.I) is not None


def unrecognised(words: list[str]) -> str | None:
    """Why a command is not a command of this project, or None if it is."""
    program = Path(words[0]).name
    if re.fullmatch(r"python3?(\.\d+)?", program):
        return python_command(words[1:])
    if program == "django-admin":
        return manage_command(words[1:])
    if program == "make":
        return make_command(words[1:])
    if program == "pip" and words[1:2] == ["install"]:
        return pip_install(words[2:])
    if program == "cd":
        return None if words[1].rstrip("/").endswith("django-safeupdates") else f"cd {words[1]}: not the checkout"
    if program == "pytest" and tool("pytest"):
        missing = [w for w in words[1:] if "/" in w and not (ROOT / w).exists()]
        return f"pytest: no {missing}" if missing else None
    if program == "mutmut" and tool("mutmut"):
        return None
    if program == "celery" and tool("celery"):
        # celery -A APP SUBCOMMAND ...: a Celery app's worker, beat and their tools.
        subcommand = next((w for w in words[3:4] if not w.startswith("-")), "")
        known = {"worker", "beat", "inspect", "control", "status", "purge", "events"}
        return None if words[1:2] == ["-A"] and subcommand in known else f"celery {shlex.join(words[1:])}: not a worker"
    return f"{words[0]}: not a command of this project"


COMMAND_BLOCKS = [block for block in ALL_BLOCKS if block.lang in COMMANDS and key(block) not in NOT_RUN]


@pytest.fixture
def the_docs_settings(settings: Any) -> None:
    """The settings the commands are parsed with: the task backend of docs/delivery.md (its commands check
    that ``--backend`` names a database backend)."""
    namespace: dict[str, Any] = {"INSTALLED_APPS": []}
    exec(block_with("docs/delivery.md", "TASKS = ").body, namespace)
    settings.TASKS = {**settings.TASKS, **namespace["TASKS"]}


@pytest.mark.parametrize("block", COMMAND_BLOCKS, ids=str)
def test_each_command_is_a_command_of_this_project(block: Block, the_docs_settings: None) -> None:
    commands = shell_commands(block.body)
    assert commands, "no command"
    assert [(shlex.join(c), unrecognised(c)) for c in commands if unrecognised(c)] == []


def test_the_command_check_finds_commands_that_are_not_this_projects():
    body = """
$ python manage.py safeupdates_relay --interval 30 --retry-faild
output line
$ python manage.py safeupdates_relax
$ make mutation MUTANT=x; make tests
$ pip install "django-safeupdates[postgres,redis]" && pip install django-safeupdate
$ python benchmarks/bench.py --round 3 > out.txt &
$ DATABASE_URL=x .venv/bin/python -m tests.mutation_report --survivor
$ rm -rf /
"""
    assert [unrecognised(c) for c in shell_commands(body)] == [
        "manage.py safeupdates_relay: Error: unrecognized arguments: --retry-faild",
        "no manage.py command 'safeupdates_relax'",
        "make reads no variable MUTANT",
        "no make target 'tests'",
        "pip install django-safeupdates[postgres,redis]: no extra ['redis']",
        "pip install django-safeupdate: not this project",
        "benchmarks/bench.py has no option ['--round']",
        "tests/mutation_report.py has no option ['--survivor']",
        "rm: not a command of this project",
    ]


# -- json, yaml, ini, sql ------------------------------------------------------------------------------


def data_blocks(lang: str) -> list[Block]:
    return [block for block in ALL_BLOCKS if block.lang == lang and key(block) not in NOT_RUN and not owner(block)]


@pytest.mark.parametrize("block", data_blocks("json"), ids=str)
def test_json_blocks_parse(block: Block) -> None:
    json.loads(block.body)


def probes(block: Block) -> list[list[str]]:
    """The commands of a Kubernetes probe block (``exec: command: [...]``, in YAML's flow style); none for
    another YAML block."""
    return [json.loads(found) for found in re.findall(r"^\s*command:\s*(\[.*\])\s*$", block.body, re.M)]


@pytest.mark.parametrize("block", [b for b in data_blocks("yaml") if probes(b)], ids=str)
def test_the_kubernetes_probes_run_commands_of_this_project(block: Block) -> None:
    assert [(command, unrecognised(command)) for command in probes(block) if unrecognised(command)] == []


@pytest.mark.parametrize("block", [b for b in data_blocks("yaml") if not probes(b)], ids=str)
@pytest.mark.django_db  # a scrape reads the age of the oldest pending request
def test_the_prometheus_rules_query_safeupdates_metrics(block: Block) -> None:
    pytest.importorskip("prometheus_client")
    from safeupdates.contrib.prometheus.metrics import registry

    exposed = {metric.name for metric in registry().collect()}
    queried = set(re.findall(r"\b(safeupdates_\w+)", re.sub(r"#.*", "", block.body)))  # comments aside
    # A counter's samples are <name>_total, a histogram's <name>_bucket, _count and _sum.
    samples = {f"{name}{suffix}" for name in exposed for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    assert queried and queried - samples == set()


@pytest.mark.parametrize("block", data_blocks("ini"), ids=str)
@pytest.mark.django_db
def test_ini_blocks_are_a_unit_of_this_project_or_postgresql_settings(block: Block) -> None:
    if block.body.lstrip().startswith("# postgresql.conf"):
        if connection.vendor != "postgresql":
            pytest.skip("PostgreSQL settings: set on PostgreSQL")
        settings_lines = [line.split("#")[0].strip() for line in block.body.splitlines()]
        with transaction.atomic(), connection.cursor() as cursor:
            for line in filter(None, settings_lines):
                name, _, value = line.partition("=")
                cursor.execute(f"SET LOCAL {name.strip()} = {value.strip()}")
        return
    unit = configparser.RawConfigParser(strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(block.body)
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    start = shlex.split(unit["Service"]["ExecStart"])
    assert unrecognised(start) is None


@pytest.mark.parametrize("block", data_blocks("sql"), ids=str)
@pytest.mark.django_db
def test_sql_blocks_run_on_postgresql(block: Block) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's SQL")
    with connection.cursor() as cursor:
        cursor.execute(block.body)
        cursor.fetchall()


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
    # The page's sample line reads as the line written.
    samples = block_with("docs/observability.md", "applied:", "text").body.splitlines()
    sample = next(sample for sample in samples if " applied: " in sample)
    assert re.fullmatch(sample_pattern(sample), line.split("] ", 1)[1]), (sample, line)


def sample_pattern(sample: str) -> str:
    """A sample line of the docs as a pattern: a shortened id (``3f1c...e2``) stands for any id, a
    number for any number."""
    words = []
    for word in sample.split(" "):
        if "..." in word:
            words.append("[0-9a-f-]+")
        else:
            words.append("".join(r"\d+" if part.isdigit() else re.escape(part) for part in re.split(r"(\d+)", word)))
    return " ".join(words)


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
