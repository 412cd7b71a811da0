"""gpuformer_lib: the helper library of the course *GPU-Accelerated Transformer Training*.

One concept per module (see the course plan). Layering, bottom to top: ``device`` and ``bench``
import nothing else of the library; ``viz`` and ``exercises`` sit on top; nothing here imports
from notebooks or tests.

Shape vocabulary, used in a comment on every reshape and matrix product in the library:

    B   batch size
    T   tokens in a sequence (sequence length)
    C   model width (d_model)
    H   number of attention heads
    hs  head size, C // H
    V   vocabulary size

Matrix-product sizes follow BLAS: ``(M, K) @ (K, N) -> (M, N)``.
"""

__version__ = "0.1.0"
