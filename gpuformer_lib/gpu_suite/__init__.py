"""The GPU measurement suite: what each chapter's lesson rests on, measured on the GPU at hand in minutes.

    python -m gpuformer_lib.gpu_suite --list                  # the items, by chapter, with their caps
    python -m gpuformer_lib.gpu_suite                         # measure, within --budget (300 s)
    python -m gpuformer_lib.gpu_suite --budget 120 --out DIR --commit SHA
    GPUFORMER_REHEARSE=h100-80gb python -m gpuformer_lib.gpu_suite --budget 60   # every item, toy sizes, CPU

It needs only what a CUDA node has: the Python it is started with, its torch (the course's floor or later),
numpy and, where torch brings it, Triton. No virtual environment, pip, network, Jupyter package or data
file: inputs are synthetic, at the chapters' shapes. Results go to ``bench_results/gpu/<device>/chNN.json``,
one file per chapter, rewritten after each item (see :mod:`gpuformer_lib.gpu_suite.runner`), with the device,
driver, CUDA, torch and Triton versions, the date, the commit, and every number's raw repeats, median and
spread; ``suite.json`` beside them lists what ran, failed or was skipped. A rehearsal writes to a temporary
folder and never under ``bench_results/gpu``.
"""

from gpuformer_lib.gpu_suite.core import ITEMS, Context, Item, SuiteError, item, ordered_items

__all__ = ["ITEMS", "Context", "Item", "SuiteError", "item", "ordered_items"]
