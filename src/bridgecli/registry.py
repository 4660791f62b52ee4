"""Collect what plugins register, resolve name collisions in one place, look things up by name.

Every object is checked against its kind's Protocol as it is registered
(:func:`bridgecli.contracts.check`): a plugin that registers an object without a member its kind
requires is an error naming the plugin and the member, before any step uses it.

This module reads the plugin manager (:mod:`bridgecli.plugins`); the manager knows nothing of it.
What is collected is cached per manager, so that :func:`bridgecli.plugins.reset` (a new manager)
forgets it too."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import pluggy

from . import contracts, plugins
from .errors import PluginError

KINDS = {
    "segmenter": "register_segmenters",
    "scorer": "register_scorers",
    "selector": "register_selectors",
    "eval_task": "register_eval_tasks",
}


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Callable[..., Any]
    description: str
    plugin: str


def collect(kind: str) -> dict[str, Entry]:
    """Every ``kind`` registered by the loaded plugins, by name."""
    return _collect(plugins.get_manager(), kind)


@lru_cache(maxsize=32)
def _collect(pm: pluggy.PluginManager, kind: str) -> dict[str, Entry]:
    hook = getattr(pm.hook, KINDS[kind])
    found: dict[str, Entry] = {}
    # Call each implementation separately so a collision can name both plugins.
    for impl in reversed(hook.get_hookimpls()):
        plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)

        def register(name: str, obj: Callable[..., Any], description: str = "", _plugin=plugin_name) -> None:
            if not isinstance(name, str) or not name:
                raise PluginError(f"plugin {_plugin} registered a {kind} with an invalid name {name!r}")
            if name in found:
                raise PluginError(
                    f"two plugins register a {kind} named '{name}': {found[name].plugin} and {_plugin}",
                    hint="uninstall one, or limit loading with BRIDGE_LOAD_PLUGINS",
                )
            contracts.check(kind, name, obj, _plugin)
            found[name] = Entry(name, obj, description, _plugin)

        impl.function(register=register)
    return found


def get(kind: str, name: str) -> Entry:
    entries = collect(kind)
    if name not in entries:
        known = ", ".join(sorted(entries)) or "none"
        raise PluginError(
            f"no {kind.replace('_', ' ')} named '{name}' (available: {known})",
            hint="`bridge plugins` lists what is loaded",
        )
    return entries[name]


def names(kind: str) -> list[str]:
    return sorted(collect(kind))


def clear_cache() -> None:
    _collect.cache_clear()
