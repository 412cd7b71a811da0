"""Imports every item module, so that each registers its items (see :func:`gpuformer_lib.gpu_suite.item`)."""

from gpuformer_lib.gpu_suite import items_ch00_01  # noqa: F401
from gpuformer_lib.gpu_suite import items_ch02_06  # noqa: F401
from gpuformer_lib.gpu_suite import items_ch11_16  # noqa: F401
from gpuformer_lib.gpu_suite import items_ch07_10  # noqa: F401
