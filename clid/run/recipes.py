"""The recipes: named sets of settings a stage takes with ``--recipe NAME``; flags given still win."""
from __future__ import annotations

import os

from clid.run.cli import positive_int


# --recipe demo: the settings make demo trains every model with (demo.sh; docs/running.md, "The demo", says
# why each differs from the paper's). --max-steps and --lr-horizon left as None are resolved by
# :func:`recipe_schedule`; 06 scales --eta to the steps.
DEMO_RECIPE = dict(preset="tiny", lr=2e-3, warmup=100, dropout=0.0, region_norm="standardize", save_every=500,
                   eval_every=0, log_every=50, max_steps=None, lr_horizon=None)
DEMO_STEPS_ENV = "CLID_DEMO_STEPS"  # the steps of --recipe demo (default 1000): fewer for a quick smoke test
DEMO_STEPS = 1000


def demo_steps() -> int:
    """The optimizer steps of ``--recipe demo``: ``CLID_DEMO_STEPS``, else 1000."""
    text = os.environ.get(DEMO_STEPS_ENV, str(DEMO_STEPS))
    try:
        return positive_int(text)
    except Exception:
        raise SystemExit(f"error: {DEMO_STEPS_ENV} must be a positive integer (the steps of --recipe demo), "
                         f"got {text!r}") from None
