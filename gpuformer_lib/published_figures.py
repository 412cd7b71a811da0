"""The registry's entries: published GPU figures, one tuple per topic (see :mod:`gpuformer_lib.published`).

Add a figure only from a source you opened and read yourself, with a verbatim quote that contains the
number. Keys are unique; ``tests/test_published.py`` checks every entry and that the book's appendix page
(``book/published_figures.md``, written by ``python -m gpuformer_lib.published``) lists them all.
"""

from gpuformer_lib.published import PublishedFigure as F

SETUP = (
    # GPUs a learner meets: memory, compute capability, what a host sync or a transfer costs
)

HARDWARE = (
    # datasheet peaks and bandwidths; measured matrix-product rates and copy bandwidths
)

KERNELS = (
    # kernels: bandwidth reached, occupancy, Triton and CUDA kernel benchmarks
)

ATTENTION = (
    # fused attention, FlashAttention, the memory of explicit attention
)

HEADS = (
    # multi-head, MQA/GQA, the KV cache, decoding speed
)

MODEL = (
    # layers and model step times, positional encodings, tensor-core-friendly shapes
)

OPTIMIZERS = (
    # optimizer memory and step time, losses, clipping
)

FIGURES: tuple[F, ...] = SETUP + HARDWARE + KERNELS + ATTENTION + HEADS + MODEL + OPTIMIZERS
