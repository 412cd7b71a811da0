"""Random numbers drawn aside: a block that draws from the global generators without moving them.

A training run draws from the global CPU generators in two places that must not disturb each other:
the model (dropout masks) and the data (a ``DataLoader`` drawing a shuffling seed and a worker seed,
augmentations in a data set). If both share one stream, *when* the data draws shifts every later
dropout mask, so a run resumed mid-epoch (whose loader is built at another step) diverges from the
uninterrupted one. :func:`isolated_rng` runs a block with the global generators (torch's CPU
generator, Python's ``random``, NumPy's legacy global state) seeded from one number, and puts them back
afterwards; :func:`derived_seed` makes that number from a run's seed and a step, so what the block
draws is a function of the two alone.

The cost is about 0.1 ms a block on a CPU, most of it copying NumPy's state twice; the training loop
does not wait for the GPU meanwhile, so on a GPU it overlaps the device's work.

Leaves out: CUDA generators (batches are drawn on the CPU; a data pipeline that draws on a GPU is not
isolated), and generators a data set owns (``torch.Generator`` objects: seed them yourself).
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from typing import Iterator

import numpy as np
import torch


def derived_seed(*parts: int | str) -> int:
    """A 63-bit seed from ``parts`` (e.g. a run's seed and a step): equal parts, equal seeds; different
    parts, unrelated seeds (``(1, 0)`` and ``(0, 1)`` do not collide the way ``seed + step`` does)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@contextlib.contextmanager
def isolated_rng(seed: int) -> Iterator[None]:
    """Run the block with torch's global CPU generator, ``random`` and NumPy's global state seeded from
    ``seed``, then restore the three states they had before: the block's draws depend on ``seed`` only,
    and the streams outside the block continue as if it had not run."""
    torch_state, python_state = torch.default_generator.get_state(), random.getstate()
    numpy_state = np.random.get_state()
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # NumPy's legacy seeding takes 32 bits
    try:
        yield
    finally:
        torch.default_generator.set_state(torch_state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
