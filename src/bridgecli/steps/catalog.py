"""The commands of ``bridge``, in pipeline order, and what each does: the help ``bridge --help`` lists and
each command shows above its flags (the flags' own help is their options type's). Torch-free and
import-free: the command line reads it before it loads any step (:mod:`bridgecli.cli.app`)."""

from __future__ import annotations

#: (name, help) of every command; a help's first paragraph is its line in ``bridge --help``
COMMANDS: list[tuple[str, str]] = [
    ("warmup", "Short standard SFT from theta_old on the warm split; then the scoring direction v."),
    (
        "score",
        (
            "Score every example: a_j (one JVP along v), attention rows A and history mass c.\n\n"
            "Several GPUs: torchrun --nproc-per-node N -m bridgecli score DATA -o OUT (ranks shard the "
            "examples; rank 0 merges the shards into OUT)."
        ),
    ),
    ("merge", "Merge shard streams of one run into one stream ordered by example index."),
    ("reference", "Store a model's per-token losses (prompt and response) in every example, for the compared methods."),
    (
        "select",
        (
            "Budgeted coupled selection of prompt context and response supervision.\n\n"
            "rho_r and closure: b_r is a budget, not a target. `bridge close` then keeps whole structural "
            "units (sentences, equations, steps) whose total length fits in b_r, chosen by an exact knapsack "
            "over their summed scores q(u); a unit with q(u) <= 0 is never chosen, and a unit longer than the"
            " room left does not fit. So the supervised share after closure can be well below rho_r (for "
            "example 45% with --rho-r 0.75), and a response whose units are all longer than b_r keeps no "
            "supervised token (`bridge compact` then drops its row and says why). `bridge inspect` reports "
            "the achieved shares."
        ),
    ),
    ("close", "Project the response selection onto whole structural units (exact knapsack under b_r)."),
    (
        "compact",
        ("Write the executed rows: compacted prompt + full response, labels -100 except the supervision set and EOS."),
    ),
    (
        "train",
        (
            "SFT from theta_old: AdamW, cosine schedule, token-mean loss over the selected positions of each "
            "step.\n\n"
            "Full-parameter by default, LoRA with --lora. Several GPUs: torchrun --nproc-per-node N -m "
            "bridgecli train ... (or accelerate launch; FSDP through an accelerate config)."
        ),
    ),
    ("eval", ("Evaluate a model on tasks from local files (one model load; eval-TASK.json each), or compare runs.")),
    (
        "compare",
        (
            "The paper's Table 1 for finished runs: each run folder's eval-*.json results (and held-out "
            "losses with intervals) side by side; with --paired, each run's differences from the first with "
            "paired intervals. Also spelled `bridge eval --compare`."
        ),
    ),
    ("inspect", "Header and summary of a bridge stream, human readable."),
    (
        "show",
        (
            "Show what a selection keeps: dropped prompt tokens struck through, supervised response tokens "
            "highlighted by score, closure units delimited by ⟦ ⟧.\n\n"
            "Without colour (piped, redirected to a file or a pager, or NO_COLOR set) the marks are "
            "characters: ~~dropped prompt~~, [[supervised response]], ⟦unit⟧."
        ),
    ),
    ("plugins", "List loaded plugins and what they register, as JSON."),
    (
        "analyze",
        (
            "Check BRIDGE's claims on your own checkpoint and data: surrogate fidelity (paper Table 2), "
            "ranking shift (Finding 2), full-state selection robustness (Theorem 1), and what a_j is made of."
        ),
    ),
]

#: (name, help) of every ``bridge analyze`` command
ANALYZE: list[tuple[str, str]] = [
    ("fidelity", "Surrogate vs exact state-conditioned scores at the selected states (paper Table 2)."),
    ("shift", ("Ranking shift (1 - Spearman with full retention) as the opposite side's retention falls (Finding 2).")),
    (
        "robustness",
        (
            "kappa_q (q = 1..n) of each example's full-state top-b selection, per side (Theorem 1), from a "
            "scores stream."
        ),
    ),
    (
        "decompose",
        (
            "a_j split into its target and anchor parts by token class: the signs the anchor decides, and (with "
            "the warm-up's common direction) the same for the debiased a_j - beta u_j."
        ),
    ),
]
