"""Small helpers the lesson checks share."""
from __future__ import annotations

import os

import numpy as np


def fresh_rng() -> tuple[np.random.Generator, int]:
    """A generator with a new seed on every run (inputs the learner has not seen), and the
    seed, so that a failure can be reproduced (set env COURSE_CHECK_SEED to fix it)."""
    seed = int(os.environ.get("COURSE_CHECK_SEED") or int.from_bytes(os.urandom(4), "little"))
    return np.random.default_rng(seed), seed
