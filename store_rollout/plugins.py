"""What another install adds to the rollout, found through entry point groups and loaded only
where it is used; nothing that ships imports one by name, and an install that registers none
adds nothing:

* `COMMANDS`: `store-rollout` sub-commands (a Typer app each), loaded only when one is run
  (app/commands.py).
* `SETTINGS_HINTS`: functions of the missing settings' names that return lines added to a
  settings error (app/runner.py:refuse_settings), loaded only on that error.
* `IMAGE_BUILDERS`: image builders, each a function of the image cache directory that returns a
  builder (tasks/kiwi/builders.py:make_builder), selected by name (`image_builder` setting).
  `kiwi` is built in.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

__all__ = ["BUILT_IN_BUILDERS", "COMMANDS", "IMAGE_BUILDERS", "SETTINGS_HINTS", "image_builders",
           "known_builder", "registered"]

COMMANDS = "store_rollout.commands"
SETTINGS_HINTS = "store_rollout.settings_hints"
IMAGE_BUILDERS = "store_rollout.image_builders"
BUILT_IN_BUILDERS = ("kiwi",)


def registered(group: str) -> dict[str, EntryPoint]:
    """The group's entry points by name (the first installed one of a name), none loaded."""
    found: dict[str, EntryPoint] = {}
    for entry in entry_points(group=group):
        found.setdefault(entry.name, entry)
    return found


@cache  # what is installed does not change while a process runs
def image_builders() -> tuple[str, ...]:
    """The names an image builder may be selected by: the built-in ones, then the registered."""
    return (*BUILT_IN_BUILDERS,
            *sorted(set(registered(IMAGE_BUILDERS)) - set(BUILT_IN_BUILDERS)))


def known_builder(name: str) -> str:
    """`name` if an image builder has it; ValueError naming the ones there are otherwise."""
    if name not in image_builders():
        raise ValueError(f"unknown builder {name!r}; expected one of {', '.join(image_builders())}")
    return name
