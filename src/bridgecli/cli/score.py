from ..steps.options import ScoreOptions
from .build import command


@command(ScoreOptions)
def run(opts: ScoreOptions) -> None:
    from ..steps.score import run_score

    run_score(opts)
