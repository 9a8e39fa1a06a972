"""The `store-rollout` command group with the sub-commands other installs add (entry point group
`store_rollout.commands`, store_rollout/plugins.py): the help lists each by name with its
distribution's summary, and its package is imported only when the sub-command is run, so
`store-rollout --help` and the application's own commands import none.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup
from typer.main import get_group

from store_rollout.plugins import COMMANDS, registered


class PluginGroup(TyperGroup):
    """A Typer group (`typer.Typer(cls=PluginGroup)`) that also offers registered sub-commands.
    (`Any` stands for the Context and Command of Typer's own copy of click, a private module.)"""

    def list_commands(self, ctx: Any) -> list[str]:
        own = super().list_commands(ctx)
        return [*own, *sorted(set(registered(COMMANDS)) - set(own))]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """A command of the group, or a stand-in for a registered one not loaded yet: its name
        and summary, what the help lists (`resolve_command` loads the real one to run it)."""
        command = super().get_command(ctx, cmd_name)
        entry = registered(COMMANDS).get(cmd_name) if command is None else None
        if entry is None:
            return command
        summary = entry.dist.metadata["Summary"] if entry.dist is not None else None
        return TyperCommand(cmd_name, help=summary, short_help=summary)

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        """The command to run: a registered one is loaded now, once."""
        name = args[0] if args else None
        entry = registered(COMMANDS).get(name) if name and name not in self.commands else None
        if name and entry is not None:
            command = get_group(entry.load())  # as add_typer adds a Typer app
            command.name = name
            self.add_command(command, name)
        return super().resolve_command(ctx, args)
