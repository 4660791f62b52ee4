"""Plugin loading: built-ins (listed in DEFAULT_PLUGINS) and entry points of group ``bridgecli``.

Environment switches:

- ``BRIDGE_LOAD_PLUGINS``: comma-separated allow-list of entry-point plugin names to load; set it
  to an empty string to load none (built-ins always load).
"""

from __future__ import annotations

import importlib
import os
from functools import lru_cache

import pluggy

from . import hookspecs

ENTRY_POINT_GROUP = "bridgecli"

DEFAULT_PLUGINS = (
    "bridgecli.builtin.segmenters",
    "bridgecli.builtin.scorers",
    "bridgecli.builtin.selectors",
    "bridgecli.builtin.baselines",
    "bridgecli.builtin.whole_examples",
    "bridgecli.builtin.eval_tasks",
)


def _make_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("bridgecli")
    pm.add_hookspecs(hookspecs)
    for name in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(name), name=name)
    allow = os.environ.get("BRIDGE_LOAD_PLUGINS")
    if allow is None:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    else:
        # Through pluggy, like the autoload above, so `bridge plugins` still shows package/version.
        for name in sorted({n.strip() for n in allow.split(",") if n.strip()}):
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
    return pm


@lru_cache(maxsize=1)
def get_manager() -> pluggy.PluginManager:
    return _make_manager()


def reset() -> None:
    """Forget the loaded plugins (tests register and unregister their own); the next
    :func:`get_manager` loads them afresh, and :mod:`bridgecli.registry` collects from it anew."""
    get_manager.cache_clear()


def describe_plugins() -> list[dict]:
    """What ``bridge plugins`` prints: every loaded plugin, its hooks and where it came from."""
    pm = get_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    out = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda item: item[0]):
        entry = {
            "name": name,
            "hooks": sorted(h.name for h in pm.get_hookcallers(plugin) or []),
            "builtin": name in DEFAULT_PLUGINS,
        }
        dist = dists.get(id(plugin))
        if dist is not None:
            entry["package"] = dist.project_name
            entry["version"] = dist.version
        out.append(entry)
    return out
