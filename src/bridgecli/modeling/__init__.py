"""Model-side code: loading, the scoring passes, the warmup direction."""
