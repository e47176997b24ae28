"""The models a submission may name, as anyone who may submit sees them: no server
address, no key variable (``settings.MODELS``, :mod:`controlplane.model_catalog`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings


def configured() -> list[dict[str, Any]]:
    """Every configured model, the default marked."""
    return [{**entry.public(), "default": name == settings.DEFAULT_MODEL}
            for name, entry in settings.MODELS.items()]
