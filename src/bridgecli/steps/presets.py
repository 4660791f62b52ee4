"""``bridge select --preset NAME``: the selections the 0.5B grid measured above a random cut, by name.

One table, :data:`PRESETS`: each preset's method, prompt retention (``rho_p``) and selector options,
and a one-line why from docs/results.md, "Where it stands". :func:`expand` fills in what the caller
left unset (``None``): a method or ``rho_p`` given explicitly wins, an ``--option`` key given wins
over the preset's same key (its other keys stay), and a method other than the preset's is refused.
``rho_r`` is never a preset's: the grid measured these at ``--rho-r 0.5``, and the caller's
``--rho-r`` (default 0.75) applies. Without a preset the method stays ``bridge``: a preset is a
choice, not the default.

Torch-free and import-light: ``bridge select --help`` lists the presets from this table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import UsageError

#: select's method and prompt retention where neither the caller nor a preset sets them
DEFAULT_METHOD = "bridge"
DEFAULT_RHO_P = 0.75
#: where the numbers behind each preset's why are, with the commands that reproduce them
SECTION = 'docs/results.md, "Where it stands"'


@dataclass(frozen=True)
class Preset:
    """What one preset sets: ``--method``, ``--rho-p`` and ``--option`` KEY=VALUE pairs (values as the
    command line spells them), and why it is there."""

    method: str
    rho_p: float
    options: Mapping[str, str] = field(default_factory=dict)
    why: str = ""

    def flags(self) -> str:
        """The flags it stands for: ``--method importance --rho-p 1 --option by=loss ...``."""
        words = [f"--method {self.method}", f"--rho-p {self.rho_p:g}"]
        words += [f"--option {k}={v}" for k, v in self.options.items()]
        return " ".join(words)


#: The presets, the rows of bench/results/grid.sh of the same names (Qwen2.5-Coder-0.5B-Instruct,
#: GSM8K accuracy over its 1,319 test items, rho_r 0.5). The importance rows pin the selector's
#: floor and weights to the values measured, whatever its defaults become.
PRESETS: dict[str, Preset] = {
    "importance-loss-resp": Preset(
        "importance",
        1.0,
        {"by": "loss", "floor": "0.5", "weights": "ipw"},
        "Every prompt token; half the response drawn leaning on the scoring checkpoint's per-token loss, "
        "weighted 1/pi: 31.5% GSM8K (3 seeds), +3.7 [2.1, 5.1] points over random-resp and a tie with "
        "full SFT (-0.7 [-2.1, 0.7]) on half its response supervision",
    ),
    "importance-resp": Preset(
        "importance",
        1.0,
        {"by": "abs", "floor": "0.5", "weights": "ipw"},
        "Every prompt token; half the response drawn leaning on |Delta_r|, weighted 1/pi: 29.5% GSM8K "
        "(3 seeds), +1.7 [0.3, 3.2] points over random-resp",
    ),
    "random-resp": Preset(
        "random",
        1.0,
        {},
        "Every prompt token, a uniform random half of the response: the reference the two above beat "
        "(27.8% GSM8K, 3 seeds)",
    ),
}


def help_text() -> str:
    """``--preset``'s help: the names (the command's help lists what each stands for, :func:`listing`)."""
    return (
        f"A measured setting of --method, --rho-p and --option: {', '.join(PRESETS)} (each listed above). "
        "Flags you give win (--option key by key); a different --method is refused."
    )


def listing() -> str:
    """The presets as ``bridge select --help`` lists them: the flags each stands for and why."""
    lines = [
        f"Presets (--preset NAME): rows of the 0.5B grid (GSM8K accuracy at rho_r 0.5; {SECTION}), two that "
        "beat a random cut and the random cut itself. Flags you give win over a preset's, key by key for --option; "
        f"--rho-r stays yours. Without --preset the method is {DEFAULT_METHOD}.",
        "",
    ]
    lines += [f"* {name}: {p.flags()}. {p.why}." for name, p in PRESETS.items()]
    return "\n".join(lines)


@dataclass(frozen=True)
class Expanded:
    """What select runs: the method, ``rho_p`` and selector options after the preset (if any)."""

    method: str
    rho_p: float
    options: dict[str, Any]
    preset: str | None = None


def expand(preset: str | None, method: str | None, rho_p: float | None, options: Mapping[str, Any]) -> Expanded:
    """The preset named ``preset`` filled in under what the caller gave (``None``: not given; an option
    key present: given), or the defaults without one. A one-line :class:`UsageError` (exit 2) for an
    unknown name or a ``method`` other than the preset's."""
    if preset is None:
        return Expanded(
            DEFAULT_METHOD if method is None else method,
            DEFAULT_RHO_P if rho_p is None else rho_p,
            dict(options),
        )
    p = PRESETS.get(preset)
    if p is None:
        raise UsageError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    if method is not None and method != p.method:
        raise UsageError(
            f"--method {method} conflicts with --preset {preset}, which runs --method {p.method}: give one of them"
        )
    return Expanded(p.method, p.rho_p if rho_p is None else rho_p, {**p.options, **options}, preset)


__all__ = [
    "DEFAULT_METHOD",
    "DEFAULT_RHO_P",
    "PRESETS",
    "SECTION",
    "Expanded",
    "Preset",
    "expand",
    "help_text",
    "listing",
]
