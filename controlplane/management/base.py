"""What every management command of the control plane checks before it runs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from kernel import UnstorableValue
from kernel.values import storable_text


class ShellCommand(BaseCommand):
    """A management command whose text arguments the database can hold: one holding NUL,
    or bytes the shell's locale did not decode as UTF-8 (which Python keeps as lone
    surrogates: ``josé`` typed in a Latin-1 shell), is refused in one line naming it,
    before the command reads or writes anything, not with the driver's traceback."""

    def execute(self, *args: Any, **options: Any) -> Any:
        named = [(f"argument {i + 1}", value) for i, value in enumerate(args)]
        for name, value in [*named, *options.items()]:
            for text in value if isinstance(value, list | tuple) else [value]:
                if isinstance(text, str):
                    try:
                        storable_text(text, repr(text[:80]))
                    except UnstorableValue as exc:
                        raise CommandError(f"{name}: {exc}") from None
        return super().execute(*args, **options)
