"""The registry's entries: published GPU figures, one tuple per topic (see :mod:`gpuformer_lib.published`).

Add a figure only from a source you opened and read yourself, with a verbatim quote that contains the
number. Keys are unique; ``tests/test_published.py`` checks every entry and that the book's appendix page
(``book/published_figures.md``) lists them all.
"""

from gpuformer_lib.published import PublishedFigure as F

HARDWARE = (
    # chapters 0-1: datasheets and measured matrix-product rates and bandwidths
)

KERNELS = (
    # chapter 2: kernels, bandwidth, occupancy
)

ATTENTION = (
    # chapters 3-4: fused attention, FlashAttention, MQA/GQA, KV cache
)

MODEL = (
    # chapter 5: layers and model step times, positional encodings
)

OPTIMIZERS = (
    # chapter 6: optimizer memory and step time, losses
)

FIGURES: tuple[F, ...] = HARDWARE + KERNELS + ATTENTION + MODEL + OPTIMIZERS
