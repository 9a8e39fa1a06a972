""":func:`make_builder`: the builder (see :class:`~tasks.kiwi.models.Builder`) that turns a
description + parameters into a qcow2, picked by name.

* ``kiwi``, built in: :class:`~tasks.kiwi.kiwi_ng.KiwiBuilder`, ``kiwi-ng system build`` on a
  copy of the description (needs root).
* any other name: a builder another install registers in the entry point group
  :data:`store_rollout.plugins.IMAGE_BUILDERS` (a function of the cache directory that returns
  the builder), loaded only when it is picked.
"""

from __future__ import annotations

from pathlib import Path

from store_rollout.plugins import IMAGE_BUILDERS, known_builder, registered
from tasks.kiwi.kiwi_ng import KiwiBuilder
from tasks.kiwi.models import Builder

__all__ = ["make_builder"]


def make_builder(name: str, cache_dir: Path) -> Builder:
    """``kiwi`` -> :class:`KiwiBuilder` (shared cache inside ``cache_dir/_kiwi-shared-cache``);
    a registered name -> what its entry point makes of ``cache_dir``.

    Raises:
        ValueError: No builder has this name.
    """
    if known_builder(name) == "kiwi":
        return KiwiBuilder(shared_cache_dir=cache_dir / "_kiwi-shared-cache")
    made: Builder = registered(IMAGE_BUILDERS)[name].load()(cache_dir)
    return made
