"""The compared token-selection methods (docs/compared-methods.md): their scoring rules, budget matching, and
the per-token reference quantities they rank by.

- :mod:`.rules`: the scoring rules (pure numpy)
- :mod:`.budgets`: budget matching for single-side methods, cross-example ranking
- :mod:`.selector`: :class:`Baseline`, a selector with declared budgets
- :mod:`.sources`: looking up reference losses/attention in a stream's examples
- :mod:`.reference`: the model pass behind ``bridge reference`` (imports torch)
- :mod:`.lingua2`: LLMLingua-2 with a local token classifier (imports torch/transformers)
"""

from .matching import MATCH_RULES, RANKINGS, SCOPES, apportion, matched_budgets, rank_across
from .selector import Baseline, Opt

__all__ = ["Baseline", "Opt", "MATCH_RULES", "RANKINGS", "SCOPES", "apportion", "matched_budgets", "rank_across"]
