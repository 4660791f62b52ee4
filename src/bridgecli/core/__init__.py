"""Pure algorithms (numpy only, no torch): budgets, top-b, alternating selection, closure."""
