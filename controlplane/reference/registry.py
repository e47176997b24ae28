"""The project's Registry: every task definition and document kind this deployment runs.

Workers, the sweep and the API all build their kernel from this one function, so
a task kind is known everywhere or nowhere (a task of an unknown kind is blocked,
not lost: DESIGN §6).
"""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

from controlplane.reference import assistant
from controlplane.reference.notices import tasks as notices
from controlplane.reference.notices.channels import Channel, HttpChannel, SmtpChannel
from kernel import Registry
from kernel.agent import register_agent


def channels() -> dict[str, Channel]:
    return {
        "http": HttpChannel(settings.EMAIL_PROVIDER_URL, settings.EMAIL_PROVIDER_TIMEOUT),
        "smtp": SmtpChannel(settings.EMAIL_HOST, settings.EMAIL_PORT, settings.DEFAULT_FROM_EMAIL),
    }


def build_registry() -> Registry:
    registry = Registry()
    notices.register(registry, channels())
    register_agent(registry, assistant.models(), assistant.toolbox(),
                   default_model=settings.DEFAULT_MODEL)
    for path in settings.KERNEL_TASK_MODULES:  # more kinds, each ``register(registry)``
        import_string(path)(registry)
    if settings.KERNEL_AGENTS:
        register_agents(registry, settings.KERNEL_AGENTS)
    return registry


def register_agents(registry: Registry, agents: dict[str, str]) -> None:
    """The framework agents of ``KERNEL_AGENTS``, each by its host (imported only when
    one is configured: the framework is an optional dependency)."""
    from kernel.hosts import pydantic_ai

    for name, path in agents.items():
        pydantic_ai.register_agent(registry, name, import_string(path))
