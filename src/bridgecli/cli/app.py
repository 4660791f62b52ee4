"""The ``bridge`` command: a thin Typer layer over bridgecli.steps (parse, call, report)."""

from __future__ import annotations

import functools
import sys
from typing import Annotated, Optional

import typer

from .. import __version__
from ..errors import BridgeError
from . import commands
from .labels import install as _plain_labels

_plain_labels()
app = typer.Typer(
    name="bridge",
    help="BRIDGE: coupled selection of prompt context and response supervision for instruction tuning.\n\n"
         "bridge score data.jsonl | bridge select -T 4 | bridge close | bridge compact -o train.jsonl",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _reporting(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BridgeError as err:
            sys.stderr.write(f"bridge {name}: error: {err}\n")
            raise typer.Exit(err.exit_code) from None
        except BrokenPipeError:
            # the reader at the other end of a pipe went away; nothing more to say
            sys.stderr.close()
            raise typer.Exit(141) from None
        except KeyboardInterrupt:
            sys.stderr.write(f"bridge {name}: interrupted\n")
            raise typer.Exit(130) from None

    return wrapper


for _name, _fn in commands.COMMANDS:
    app.command(_name)(_reporting(_name, _fn))
for _name, _build in commands.GROUPS:
    app.add_typer(_build(_reporting), name=_name)


def _version(value: bool):
    if value:
        typer.echo(f"bridgecli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                          help="Show the version and exit.")] = None):
    pass


def _terminated(signum, frame) -> None:
    # SIGTERM unwinds like an error, so atomic writers remove their temporary files
    sys.stderr.write("bridge: terminated\n")
    raise SystemExit(128 + signum)


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _terminated)
    app()
