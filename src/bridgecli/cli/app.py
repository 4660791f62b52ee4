"""The ``bridge`` command: a thin Typer layer over bridgecli.steps (parse, call, report).

The root group (:class:`LazyGroup`, Click's lazy-loading pattern) lists the commands from
:mod:`bridgecli.steps.catalog` and imports a command's module (``bridgecli.cli.NAME``: its ``run``, or
the group its ``build`` makes) only when that command runs or shows its help, so ``bridge --version`` and
``bridge --help`` load no step (bench/cli/startup.py). Click's usage errors, a step's
:class:`~bridgecli.errors.BridgeError` and a failed write are one line, ``bridge CMD: error: ...``."""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from typing import Annotated, Any, Callable, Optional

import typer
import typer.core

from .. import __version__
from ..steps.catalog import COMMANDS


class Group(typer.core.TyperGroup):
    """A group whose errors are one line, ``bridge CMD: error: ...`` (exit 2), like every other error; given
    no arguments it shows its help and exits 2."""

    def get_params(self, ctx: Any) -> list:
        from .build import plain_flags

        return plain_flags(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            text = ctx.get_help()  # rich help prints itself and returns nothing
            if text:
                typer.echo(text)
            raise typer.Exit(2)
        return super().parse_args(ctx, args)

    def make_context(self, info_name, args, parent=None, **extra):
        with _one_line(parent):
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        with _one_line(ctx):
            return super().invoke(ctx)


class LazyGroup(Group):
    """The root group: the commands of the catalog, each a stand-in holding its help (what ``bridge --help``
    and shell completion read) until :meth:`resolve_command` loads the real one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.helps = dict(COMMANDS)
        self.loaded: set[str] = set()
        for name, text in COMMANDS:
            self.commands[name] = typer.core.TyperCommand(name, help=text)

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[Any, Any, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        # the command being parsed, for errors Click raises without a context (a flag missing its value)
        ctx.meta.setdefault(_PATH, []).append(name)
        return name, (self.load(name) if name in self.helps else cmd), rest

    def load(self, name: str) -> Any:
        """The command ``name`` itself (imported and built on first use)."""
        if name not in self.loaded:
            self.commands[name] = build(name, self.helps[name])
            self.loaded.add(name)
        return self.commands[name]

    def load_all(self) -> None:
        """Every command built (what docs/cli-reference.md is generated from)."""
        for name in self.helps:
            self.load(name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from .build import escaped

        for name in set(self.helps) - self.loaded:  # the stand-ins' help, as rich's markup must get it
            self.commands[name].help = escaped(self.helps[name])
        super().format_help(ctx, formatter)


def build(name: str, text: str) -> Any:
    """The Click command ``name`` with the help ``text``: its module's ``run``, wrapped by :func:`reporting`
    (a module's ``MORE_HELP()`` adds to the help), or the group its module's ``build`` makes."""
    from .build import Command, escaped

    module = importlib.import_module(f"{__package__}.{name}")
    if hasattr(module, "build"):
        return typer.main.get_command(module.build(reporting))
    more = getattr(module, "MORE_HELP", None)
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")
    help = escaped(text + (f"\n\n{more()}" if more else ""))
    sub.command(name, cls=Command, help=help)(reporting(name, module.run))
    return typer.main.get_command(sub)


_PATH = "bridgecli.command_path"


@contextlib.contextmanager
def _one_line(ctx):
    try:
        yield
    except typer.TyperException as err:  # Click's exceptions (Typer's public base class of them)
        if getattr(err, "exit_code", None) != 2 or not hasattr(err, "ctx"):  # a usage error has both
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


def reporting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with every error of a step reported in one line, and the exit codes of docs/cli.md."""
    from ..errors import BridgeError
    from ..io import guarded_stdout, silence_stdout, write_error

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with guarded_stdout():  # a failed write to stdout is a WriteError too (> /dev/full)
                return fn(*args, **kwargs)
        except BridgeError as err:
            sys.stderr.write(f"bridge {name}: error: {err}\n")
            raise typer.Exit(err.exit_code) from None
        except BrokenPipeError:  # the reader of a pipe went away (`| head`): quiet, as if SIGPIPE (128 + 13)
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


app = typer.Typer(
    cls=LazyGroup,
    name="bridge",
    help="BRIDGE: coupled selection of prompt context and response supervision for instruction tuning.\n\n"
    "bridge score data.jsonl | bridge select -T 4 | bridge close | bridge compact -o train.jsonl",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


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
