"""``bridge plugins``: the loaded plugins and what each kind of plugin registers."""

from __future__ import annotations

from typing import Any

from .. import registry
from ..plugins import describe_plugins


def run_plugins() -> dict[str, Any]:
    """Every loaded plugin, and every registered name of each kind with its plugin and description."""
    return {
        "plugins": describe_plugins(),
        "registered": {
            kind: {
                name: {"plugin": e.plugin, "description": e.description}
                for name, e in sorted(registry.collect(kind).items())
            }
            for kind in registry.KINDS
        },
    }
