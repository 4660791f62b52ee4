"""bridgecli: BRIDGE coupled prompt/response token selection for efficient instruction tuning."""

from typing import TYPE_CHECKING, Any

from . import timings  # noqa: F401  (its clock starts at the first import)

if TYPE_CHECKING:
    from .hookspecs import hookimpl

__version__ = "0.1.0"
PRODUCER = f"bridgecli {__version__}"

__all__ = ["hookimpl", "__version__", "PRODUCER"]


def __getattr__(name: str) -> Any:
    """``bridgecli.hookimpl`` (what a plugin marks its hooks with), imported on first use: the hook
    machinery (pluggy) is not loaded by ``bridge --version`` or ``--help``."""
    if name == "hookimpl":
        from .hookspecs import hookimpl

        return hookimpl
    raise AttributeError(f"module 'bridgecli' has no attribute {name!r}")
