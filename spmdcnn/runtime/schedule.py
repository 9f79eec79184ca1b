"""Learning-rate schedules (``optimizer.schedule`` of a job): the rate of every step is a function of the step
alone, so a resumed run follows the same schedule as one that never stopped.

- ``warmup_steps`` W > 0: steps ``0 .. W-1`` ramp linearly, step ``s`` at ``lr * (s + 1) / W``;
- then ``constant``: ``lr``;
- ``step``: ``lr * gamma ** floor(t / decay_every)``, ``t`` the steps since the warm-up;
- ``cosine``: from ``lr`` down to ``min_lr`` along half a cosine over the steps left after the warm-up
  (``min_lr + (lr - min_lr) * (1 + cos(pi * t / T)) / 2``, ``T`` the run's steps after the warm-up).
"""

import math


def learning_rate(spec, step, total_steps):
    """The rate of ``step`` (0-based) of a run of ``total_steps`` under ``spec`` (a job's ``optimizer``)."""
    base, warmup = spec["lr"], spec["warmup_steps"]
    if step < warmup:
        return base * (step + 1) / warmup
    since = step - warmup
    if spec["schedule"] == "step":
        return base * spec["gamma"] ** (since // spec["decay_every"])
    if spec["schedule"] == "cosine":
        span = max(1, total_steps - warmup)
        low = spec["min_lr"]
        return low + (base - low) * (1 + math.cos(math.pi * min(since, span) / span)) / 2
    return base
