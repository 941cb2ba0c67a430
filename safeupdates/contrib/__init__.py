"""Optional parts, apart from the core write path, which never imports them.

- ``safeupdates.contrib.batches``, ``safeupdates.contrib.controls``, ``safeupdates.contrib.idempotent``:
  the job tools (``fan_out()``, ``enqueue()``, ``@idempotent``), Django apps to add to ``INSTALLED_APPS``
  when you use them. Without its app, importing or calling a tool raises ``ImproperlyConfigured``.
- ``safeupdates.contrib.drf``: an integration that needs its extra installed (``django-safeupdates[drf]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from django.apps import AppConfig, apps
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

from safeupdates import conf, delivery


class JobToolApp(NamedTuple):
    tool: str  # what a user calls
    migrate: bool  # whether the app has tables of its own


#: The apps of the job tools, and what each is needed for.
JOB_TOOL_APPS = {
    "safeupdates.contrib.batches": JobToolApp("fan_out()", migrate=True),
    "safeupdates.contrib.controls": JobToolApp("enqueue()", migrate=False),
    "safeupdates.contrib.idempotent": JobToolApp("@idempotent", migrate=False),
}


def _and_migrate(app: str) -> str:
    return " and run migrate" if JOB_TOOL_APPS[app].migrate else ""


def require_app(app: str) -> None:
    """Raise ``ImproperlyConfigured`` naming ``app`` if the app registry knows it is not installed.

    While ``INSTALLED_APPS`` is still being loaded the registry cannot tell: then nothing is raised, and
    the system check that :func:`guard_app` registers reports it (``safeupdates.E009``).
    """
    if apps.apps_ready and not apps.is_installed(app):
        raise ImproperlyConfigured(
            f"{JOB_TOOL_APPS[app].tool} needs the app {app!r}: add it to INSTALLED_APPS{_and_migrate(app)}."
        )


def guard_app(app: str) -> None:
    """Run on import of the package of job tool app ``app``: refuse an app that is not installed, so that
    its models never register and its tools never run without it (:func:`require_app`), and register
    the check that reports an import made before the registry could tell."""
    require_app(app)

    def check_installed(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
        if apps.is_installed(app):
            return []
        return [
            Error(
                f"{JOB_TOOL_APPS[app].tool} is imported, but its app {app!r} is not in INSTALLED_APPS.",
                hint=f"Add {app!r} to INSTALLED_APPS{_and_migrate(app)}.",
                id="safeupdates.E009",
            )
        ]

    register(check_installed, Tags.compatibility)


#: The job tools that deliver their jobs through RQ whatever ``SAFEUPDATES_DELIVERY`` says (W021).
RQ_ONLY_TOOLS = {
    "safeupdates.contrib.controls": "enqueue() with unique/serial/throttle",
    "safeupdates.contrib.batches": "fan_out()",
}


@register(Tags.compatibility)
def check_tools_need_rq(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W021: apply jobs go through another delivery than RQ, and job tools that deliver through RQ only are
    installed."""
    tools = [tool for app, tool in RQ_ONLY_TOOLS.items() if apps.is_installed(app)]
    if not tools or conf.delivery() not in delivery.BACKENDS:
        return []  # E020 says what is wrong
    try:
        chosen = delivery.backend()
    except delivery.Unavailable:  # E021, E025
        return []
    from safeupdates.delivery.rq import RQBackend  # the tools' own delivery, whatever this one is

    if isinstance(chosen, RQBackend):
        return []
    return [
        Warning(
            f'SAFEUPDATES_DELIVERY is "{chosen.name}", but {" and ".join(tools)} deliver their jobs through RQ only.',
            hint="Keep django_rq, RQ_QUEUES and rqworker processes for them, or remove their apps from "
            f"INSTALLED_APPS. @idempotent works on {chosen.task_functions}.",
            id="safeupdates.W021",
        )
    ]
