"""Diagnostics of BRIDGE's claims on your own model and data (``bridge analyze``, ``bridge show``,
``bridge inspect --stats``).

The math lives in numpy modules (``metrics``, ``fidelity``, ``shift``, ``robustness``, ``stats``),
the renderers in ``render`` and ``plots``; only ``exact`` (exact state-conditioned scores by
perturbation) needs torch and a model.
"""
