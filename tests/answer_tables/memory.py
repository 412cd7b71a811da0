"""Chapter 9: the loss's peak, a layer's saved activations, the low-memory loss."""

import torch
import torch.nn.functional as F

from answer_tables import Table, Wrong
from gpuformer_lib.activation_accounting import chunked_cross_entropy
from gpuformer_lib.exercises import memory
from gpuformer_lib.memory import layer_activation_bytes

LOGITS = 4 * 32 * 2048
"""Exercise 9.1's B x T x V."""
LOSS_PEAK_MEASURED = 12 * LOGITS + 1032
"""What LiveBytes measured in the notebook: the three tensors, the targets and a few scalars (shown, not graded)."""


def loss_peak(answer):
    return memory.check_loss_peak_prediction(answer, LOSS_PEAK_MEASURED)


def layer_bytes(d_model, n_heads, seq_len, batch_size):
    """The chapter's solution."""
    tokens = seq_len * batch_size
    values = 2 * d_model + 6 * d_model + 2 * 4 * d_model
    return tokens * values * 4 + tokens * n_heads * 4


def per_token(values, bytes_per_value=4, lse=True):
    """A prediction of ``values`` x C per token and channel, plus the log-sum-exp per head if ``lse``."""
    return lambda C, H, T, B: T * B * (values * C * bytes_per_value + (4 * H if lse else 0))


def low_memory_loss(hidden, head, targets, chunk_rows=64):
    """The chapter's solution: chunks recomputed in the backward pass."""
    def chunk_loss(h, y):
        return F.cross_entropy(head(h).float(), y, reduction="sum", ignore_index=-100)

    total = sum(torch.utils.checkpoint.checkpoint(chunk_loss, h, y, use_reentrant=False)
                for h, y in zip(hidden.split(chunk_rows), targets.split(chunk_rows)))
    return total / (targets != -100).sum()


def chunked_kept_whole(hidden, head, targets, chunk_rows=64):
    """Chunks, but autograd keeps every chunk's log-probs for the backward pass."""
    total = sum(F.cross_entropy(head(h).float(), y, reduction="sum")
                for h, y in zip(hidden.split(chunk_rows), targets.split(chunk_rows)))
    return total / (targets != -100).sum()


def over_all_rows(hidden, head, targets):
    """The right chunks, divided by every row, the ignored ones included."""
    return low_memory_loss(hidden, head, targets) * (targets != -100).sum() / len(targets)


def mean_of_means(hidden, head, targets, chunk_rows=64):
    def chunk_loss(h, y):
        return F.cross_entropy(head(h).float(), y)

    means = [torch.utils.checkpoint.checkpoint(chunk_loss, h, y, use_reentrant=False)
             for h, y in zip(hidden.split(chunk_rows), targets.split(chunk_rows))]
    return sum(means) / len(means)


TABLES = [
    Table(
        "check_loss_peak_prediction", loss_peak,
        right=(12 * LOGITS, 3 * 4 * 32 * 2048 * 4, 3.1e6, 3 * 2**20),
        wrong=(Wrong("8 bytes a logit (section 9.1's beyond the saved tensors)", 8 * LOGITS, ("log-probs", "three")),
               Wrong("the log-probs alone", 4 * LOGITS, ("one of three",)),
               Wrong("the logits counted too", 16 * LOGITS, ("logits themselves are gone",)),
               Wrong("bits not bytes", 3 * 32 * LOGITS, ("32 bits",)),
               Wrong("16-bit values", 3 * 2 * LOGITS, ("float32", "not 2")),
               Wrong("MiB not bytes", 3.0, ("MiB", "bytes"))),
    ),
    Table(
        "check_layer_activation_prediction", memory.check_layer_activation_prediction,
        right=(layer_bytes,
               lambda C, H, T, B: layer_activation_bytes(d_model=C, n_heads=H, seq_len=T, batch_size=B,
                                                         activation="gelu"),
               per_token(16, lse=False)),  # the log-sum-exp is a rounding error
        wrong=(Wrong("ReLU's count for the GELU layer", per_token(12), ("GELU", "ReLU")),
               Wrong("the LayerNorms' inputs forgotten", per_token(14), ("LayerNorm",)),
               Wrong("Q, K and V forgotten", per_token(13), ("Q, K and V",)),
               Wrong("explicit attention's T x T", lambda C, H, T, B: per_token(16)(C, H, T, B) + T * B * 2 * H * T * 4,
                     ("fused attention", "T x T")),
               Wrong("16 bits", per_token(16, bytes_per_value=2), ("4 bytes a value",)),
               Wrong("values not bytes", lambda C, H, T, B: T * B * (16 * C + H), ("counted values",)),
               Wrong("Korthikanti's 34 s b h", lambda C, H, T, B: T * B * 34 * C, ("Korthikanti", "one by one"))),
    ),
    Table(
        "check_low_memory_loss", memory.check_low_memory_loss,
        right=(low_memory_loss, lambda h, w, y: chunked_cross_entropy(h, w, y, chunk_rows=64)),
        wrong=(Wrong("the plain loss", lambda h, w, y: F.cross_entropy(w(h).float(), y), ("same peak", "chunks")),
               Wrong("chunks that autograd keeps whole", chunked_kept_whole, ("recompute", "checkpoint")),
               Wrong("divided by all rows", over_all_rows, ("ignored (-100) ones included",)),
               Wrong("a mean of the chunks' means", mean_of_means, ("mean of the chunks' means",)),
               Wrong("detached from autograd",
                     lambda h, w, y: low_memory_loss(h.detach(), w, y).detach().requires_grad_(),
                     ("gradients did not reach",))),
    ),
]
