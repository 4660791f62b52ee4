"""The ``bridge`` command: a thin Typer layer over bridgecli.steps (parse, call, report)."""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Annotated, Optional

import typer

from .. import __version__
from ..errors import BridgeError
from ..io import guarded_stdout, silence_stdout, write_error
from . import commands
from .labels import Command, Group


class _OneLineErrors(Group):
    """Click's own usage errors (an unknown flag, a value that is not a number, a missing argument)
    reported like every other error: one line, ``bridge CMD: error: ...``, exit 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        if not args and self.no_args_is_help:  # `bridge` or `bridge analyze` alone: Click shows the help
            try:
                return super().make_context(info_name, args, parent=parent, **extra)
            except typer.TyperException as err:
                setattr(err, _HELP, True)
                raise
        with _one_line(None):
            return super().make_context(info_name, args, parent=parent, **extra)

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        # the command being parsed, for errors Click raises without a context (a flag missing its value)
        ctx.meta.setdefault(_PATH, []).append(name)
        return name, cmd, rest

    def invoke(self, ctx):
        with _one_line(ctx):
            return super().invoke(ctx)


_PATH = "bridgecli.command_path"
_HELP = "_bridgecli_shows_help"


@contextlib.contextmanager
def _one_line(ctx):
    try:
        yield
    except typer.TyperException as err:  # Click's exceptions (Typer's public base class of them)
        if getattr(err, _HELP, False) or not _usage_error(err):
            raise
        names, where = [], err.ctx
        while where is not None and where.parent is not None:  # the root is `bridge` however it was run
            names.insert(0, where.info_name)
            where = where.parent
        if err.ctx is None and ctx is not None:
            names = list(ctx.meta.get(_PATH, []))
        path = " ".join(["bridge", *names])
        message = " ".join(err.format_message().split())
        sys.stderr.write(f"{path}: error: {message} (see {path} --help)\n")
        raise typer.Exit(err.exit_code) from None


def _usage_error(err: Exception) -> bool:
    """Click's usage errors (exit 2, with the context they arose in), told by their public attributes."""
    return getattr(err, "exit_code", None) == 2 and hasattr(err, "ctx") and hasattr(err, "format_message")


app = typer.Typer(
    cls=_OneLineErrors,
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
            with guarded_stdout():  # a failed write to stdout is a WriteError too (> /dev/full)
                return fn(*args, **kwargs)
        except BridgeError as err:
            sys.stderr.write(f"bridge {name}: error: {err}\n")
            raise typer.Exit(err.exit_code) from None
        except BrokenPipeError:
            # the reader at the other end of a pipe went away (`| head`): exit quietly, as the
            # shell's tools do when SIGPIPE kills them (128 + 13)
            silence_stdout()
            raise typer.Exit(141) from None
        except KeyboardInterrupt:
            sys.stderr.write(f"bridge {name}: interrupted\n")
            raise typer.Exit(130) from None
        except Exception as exc:  # a failed write (full disk, ...) that no writer named: still one line
            failed = write_error(exc, None)
            if failed is None:
                raise
            sys.stderr.write(f"bridge {name}: error: {failed}\n")
            raise typer.Exit(failed.exit_code) from None

    return wrapper


for _name, _fn in commands.COMMANDS:
    app.command(_name, cls=Command)(_reporting(_name, _fn))
for _name, _build in commands.GROUPS:
    app.add_typer(_build(_reporting), name=_name, cls=_OneLineErrors)


def _version(value: bool):
    if value:
        typer.echo(f"bridgecli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = None,
):
    pass


def _terminated(signum, frame) -> None:
    # SIGTERM unwinds like an error, so atomic writers remove their temporary files
    sys.stderr.write("bridge: terminated\n")
    raise SystemExit(128 + signum)


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _terminated)
    app()
