from __future__ import annotations

import json

import typer

from .. import registry
from ..plugins import describe_plugins


def plugins():
    """List loaded plugins and what they register, as JSON."""
    out = {
        "plugins": describe_plugins(),
        "registered": {
            kind: {
                name: {"plugin": e.plugin, "description": e.description}
                for name, e in sorted(registry.collect(kind).items())
            }
            for kind in registry.KINDS
        },
    }
    typer.echo(json.dumps(out, indent=2))
