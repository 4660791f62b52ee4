"""bridgecli: BRIDGE coupled prompt/response token selection for efficient instruction tuning."""

from . import timings  # noqa: F401  (its clock starts at the first import)
from .hookspecs import hookimpl

__version__ = "0.1.0"
PRODUCER = f"bridgecli {__version__}"

__all__ = ["hookimpl", "__version__", "PRODUCER"]
