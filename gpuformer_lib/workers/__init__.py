"""The distributed workers of chapters 11, 12 and 13: modules that torchrun starts once per process.

A worker must live in a file every process can import (a function defined in a notebook cell cannot
be started in another process). These ship inside the package, so they run wherever the library is
installed, Colab included, without a clone of the repository:

    python -m gpuformer_lib.workers.data_parallel equivalence        # starts 2 processes itself
    torchrun --standalone --nproc_per_node=2 -m gpuformer_lib.workers.data_parallel equivalence
    distributed.launch(distributed.worker_path("data_parallel"), 2, ["equivalence"])  # from a notebook

Covers: :func:`run_command`, the command line the workers share, and :func:`lm_loss`, the loss their
language models train on through ``speed.make_train_step``. Leaves out: the parallel algorithms
themselves (:mod:`gpuformer_lib.distributed`), which the workers call and check against one process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from gpuformer_lib import distributed


def lm_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, int]:
    """Mean cross-entropy of ``model`` on ``batch = (x, y)``, inputs and targets (B, T), and the number
    of predicted tokens B * T: a ``loss_fn`` for ``speed.make_train_step``."""
    x, y = batch
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten()), y.numel()  # (B*T, V) against (B*T,)


def run_command(commands: dict[str, Callable], module: str, argv: Sequence[str] | None = None) -> None:
    """Run one of a worker's ``commands`` on every rank. Started by hand (not by torchrun), start the
    processes first: ``--nproc`` of them under torchrun, each running this module with the command. A rank
    ends with ``os._exit(0)`` once its process group is destroyed (see the comment at the end)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("command", choices=sorted(commands))
    parser.add_argument("--nproc", type=int, default=2, help="processes to start when not run by torchrun")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        distributed.launch(distributed.worker_path(module.rsplit(".", 1)[-1]), args.nproc, [args.command])
        return
    with distributed.process_group(os.environ.get("GPUFORMER_BACKEND"), timeout_s=60) as (env, device):
        started = time.perf_counter()
        commands[args.command](env, device)
        distributed.report("seconds", time.perf_counter() - started)
    # The work is done, its results reported (flushed) and the group destroyed: leave without the interpreter's
    # teardown, where gloo's worker threads may still hold work whose tensors are freed too late. A rank of
    # chapter 12 died so once in CI (SIGABRT, "terminate called without an active exception") after its last
    # result, failing a launch whose every result had come.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
