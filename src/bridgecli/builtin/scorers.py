"""Built-in scorers, registered through the same hook as third-party ones."""

from ..hookspecs import hookimpl
from ..modeling.scoring import BridgeScorer, ExactScorer


@hookimpl(trylast=True)
def register_scorers(register):
    register("bridge", BridgeScorer, "a_j by one forward-mode JVP along v; A and c from the same pass")
    register("exact", ExactScorer, "diagnostic: a_j by one backward pass per response token (slow)")
