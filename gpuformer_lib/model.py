"""The whole model: an encoder-decoder Transformer and a decoder-only language model, from one config.

Implements Vaswani et al. (2017) §3 (the encoder-decoder, embeddings scaled by sqrt(d_model),
shared embedding and output weights, §3.4) and the decoder-only variant of GPT (Radford et al.
2018/2019): causal self-attention blocks, no cross-attention.

``Transformer.encoder`` and ``.decoder`` are named like ``nn.Transformer``'s, so its encoder and
decoder load with ``load_state_dict``. Inputs are checked where mistakes are likely (ranks, token
ids, lengths, mask shapes) and fail with a message that says what is wrong.

Also here, next to the config it reads: :func:`transformer_flops`, the matrix-product FLOPs of a step.

Leaves out: training, mixed precision and parallelism, which wrap the model from outside (``speed``,
``train``, ``distributed``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch
from torch import Tensor, nn

from gpuformer_lib._checks import require_bool_fields, require_bools
from gpuformer_lib.layers import DecoderLayer, EncoderLayer, LayerStack, PositionalEncoding


def _is_int(value) -> bool:
    """An integer (Python's or NumPy's), not a bool: ``True`` as a size is a mistake, not 1."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes and choices of a Transformer. Change one with ``dataclasses.replace(config, ...)``."""

    vocab_size: int
    """Target vocabulary (the decoder's input and output); the only vocabulary of a DecoderLM."""
    src_vocab_size: int | None = None
    """Source vocabulary of the encoder; None means the same as ``vocab_size``."""
    d_model: int = 512
    """Model width C: the size of every token's vector between layers."""
    n_heads: int = 8
    """Attention heads H; d_model must be divisible by it (head size hs = d_model // n_heads)."""
    n_encoder_layers: int = 6
    """Encoder layers (unused by DecoderLM)."""
    n_decoder_layers: int = 6
    """Decoder layers (the blocks of a DecoderLM)."""
    d_ff: int = 2048
    """Hidden width of the feed-forward block, usually 4 * d_model."""
    dropout: float = 0.1
    """Dropout on attention weights, sublayer outputs and embeddings."""
    max_len: int = 512
    """Longest sequence the positional encoding covers."""
    norm_first: bool = True
    """True: pre-LN (x + f(LN(x))), stable to train; False: post-LN (LN(x + f(x))), the original paper."""
    activation: str = "relu"
    """Feed-forward non-linearity: 'relu' (the paper) or 'gelu' (GPT)."""
    positional: str = "sinusoidal"
    """'sinusoidal' (fixed, the paper) or 'learned' (a trained table, GPT)."""
    tie_embeddings: bool = True
    """Share the target embedding with the output projection (§3.4), saving vocab_size * d_model weights;
    the shared projection scales its input by d_model^-1/2 so that the first loss is near log(vocab_size)
    (see :class:`OutputProjection`)."""
    share_src_tgt_embeddings: bool = False
    """Use one embedding for source and target (needs one shared vocabulary)."""
    fused_attention: bool = True
    """Attention by PyTorch's fused ``F.scaled_dot_product_attention`` (flash or memory-efficient kernels,
    no (B, H, T, T) scores kept); False: the explicit computation, which keeps the scores for the
    backward pass and which FLOP counters see. Same parameters either way, so a ``state_dict`` loads
    across."""
    check_token_ids: bool = True
    """Check in every forward pass that the token ids lie in [0, vocab_size). On a GPU, reading the ids'
    minimum and maximum back is a host sync per step; tuned training turns it off (compiled models
    skip it anyway)."""

    def __post_init__(self):
        positive = ("vocab_size", "d_model", "n_heads", "d_ff", "max_len")
        for name in positive:
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if self.src_vocab_size is not None and (not _is_int(self.src_vocab_size) or self.src_vocab_size < 1):
            raise ValueError(f"src_vocab_size must be a positive int or None, got {self.src_vocab_size!r}")
        if not (_is_int(self.n_encoder_layers) and _is_int(self.n_decoder_layers)):
            raise ValueError(f"layer counts must be ints, got n_encoder_layers={self.n_encoder_layers!r} and "
                             f"n_decoder_layers={self.n_decoder_layers!r}")
        if self.n_encoder_layers < 0 or self.n_decoder_layers < 1:
            raise ValueError(f"need n_encoder_layers >= 0 and n_decoder_layers >= 1, got "
                             f"{self.n_encoder_layers} and {self.n_decoder_layers}")
        require_bool_fields(self)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, numbers.Real):
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                             f"try n_heads={math.gcd(self.d_model, self.n_heads)} or a d_model that is a multiple of {self.n_heads}")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positional encodings need an even d_model, got {self.d_model}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', not {self.activation!r}")
        if self.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"positional must be 'sinusoidal' or 'learned', not {self.positional!r}")
        if self.share_src_tgt_embeddings and self.source_vocab_size != self.vocab_size:
            raise ValueError(f"share_src_tgt_embeddings needs one vocabulary, but src_vocab_size="
                             f"{self.src_vocab_size} and vocab_size={self.vocab_size}")

    @property
    def source_vocab_size(self) -> int:
        return self.vocab_size if self.src_vocab_size is None else self.src_vocab_size

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_heads


def paper_base_config(vocab_size: int = 37000) -> TransformerConfig:
    """The paper's base model (Table 3): 6 + 6 post-LN layers, C = 512, 8 heads, d_ff = 2048, one
    shared 37,000-token vocabulary."""
    return TransformerConfig(vocab_size=vocab_size, norm_first=False, share_src_tgt_embeddings=True)


def gpt2_config(d_model: int = 768, n_layers: int = 12, n_heads: int = 12) -> TransformerConfig:
    """A GPT-2-shaped decoder-only model, small by default (124 M parameters): pre-LN, GELU, learned
    positions over 1024 tokens, tied embeddings, no dropout, and the 50257-token vocabulary padded to
    50304 = 2^7 * 393, which keeps matrix sizes friendly to the hardware. Medium is (1024, 24, 16), XL
    (1600, 48, 25)."""
    return TransformerConfig(vocab_size=50304, d_model=d_model, n_heads=n_heads, n_decoder_layers=n_layers,
                             d_ff=4 * d_model, dropout=0.0, max_len=1024, activation="gelu", positional="learned")


def transformer_flops(config: TransformerConfig, batch_size: int, tgt_len: int, src_len: int = 0,
                      training: bool = True) -> int:
    """Matrix-product FLOPs of one step of the course's models, counted as the hardware does them.

    With ``src_len > 0`` the encoder-decoder ``Transformer``
    (``config.n_encoder_layers`` + ``n_decoder_layers``), otherwise the decoder-only ``DecoderLM``.
    Per layer and token: projections 8 C^2 (Q, K, V, output), feed-forward 4 C d_ff, attention 4 T C
    (scores and weighted sum over the full T x T, as the explicit computation does them: it computes the
    masked scores, then fills them with -inf; ``FlopCounterMode`` counts the same). A fused causal kernel
    skips the tiles above the diagonal (chapter 3 counts and times them) and does about half of that term
    at long T: ``tiled_attention.attention_flops(causal=True)`` and the course's predictor count that half;
    cross-attention adds 4 C^2 + 4 S C, and projecting the encoder memory 4 S C^2 per sequence. Training
    is 3x the forward (the backward computes gradients for inputs and weights). Embedding lookups,
    norms and softmax are left out, as is customary (they are a few percent).

    Note: ``torch.utils.flop_counter.FlopCounterMode`` agrees with this on the explicit attention path;
    on the CPU it does not count PyTorch's fused SDPA kernel at all.
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    require_bools(training=training)
    for name, value, least in (("batch_size", batch_size, 1), ("tgt_len", tgt_len, 1), ("src_len", src_len, 0)):
        if not _is_int(value) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}"
                             + (" (src_len=0 means a decoder-only model)" if name == "src_len" else ""))
    batch_size, tgt_len, src_len = int(batch_size), int(tgt_len), int(src_len)  # NumPy's int32 would wrap around
    C, F, T, S, V = config.d_model, config.d_ff, tgt_len, src_len, config.vocab_size

    def self_layer(n: int) -> int:
        return 8 * n * C * C + 4 * n * n * C + 4 * n * C * F

    if src_len:
        encoder = config.n_encoder_layers * self_layer(S)
        cross = 4 * T * C * C + 4 * S * C * C + 4 * T * S * C
        decoder = config.n_decoder_layers * (self_layer(T) + cross)
        forward = encoder + decoder + 2 * T * C * V
    else:
        forward = config.n_decoder_layers * self_layer(T) + 2 * T * C * V
    return batch_size * forward * (3 if training else 1)


def checkpointed_training_flops(config: TransformerConfig, batch_size: int, seq_len: int,
                                checkpointed_layers: int) -> int:
    """Matrix-product FLOPs the hardware does in one training step of a decoder-only ``DecoderLM`` whose
    ``checkpointed_layers`` layers are checkpointed (``speed.apply_activation_checkpointing`` wraps the layer
    stack only): :func:`transformer_flops` plus what the backward pass recomputes, HFU's numerator (MFU's is
    :func:`transformer_flops`).

    Recomputed is one forward pass of those layers only: the embedding, the output projection and the loss are
    outside them. And not all of it: PyTorch's non-reentrant checkpoint (``use_reentrant=False``, with its
    early stop, on by default) stops recomputing once the last tensor the backward pass needs is back. In a
    pre-LN layer (``norm_first``) the feed-forward's second product ends the layer: its output goes only into
    the residual sum, which saves nothing, so it is not run again (``2 T C d_ff`` per sequence less). In a
    post-LN layer the last norm saves that output and the whole layer is recomputed. Either way the total is
    below the 4/3 of the model's FLOPs that recomputing everything would give. ``FlopCounterMode`` agrees on
    the explicit attention path (``tests/test_memory_and_flops.py``)."""
    model_flops = transformer_flops(config, batch_size, seq_len)  # checks config, batch_size and seq_len
    if not _is_int(checkpointed_layers) or not 0 <= checkpointed_layers <= config.n_decoder_layers:
        raise ValueError(f"checkpointed_layers must be an int from 0 to the {config.n_decoder_layers} decoder layers,"
                         f" got {checkpointed_layers!r}")
    C, F, T = config.d_model, config.d_ff, int(seq_len)
    layer_forward = 8 * T * C * C + 4 * T * T * C + 4 * T * C * F  # as transformer_flops's self_layer
    if config.norm_first:  # the last product's output is saved by nothing: the early stop skips it
        layer_forward -= 2 * T * C * F
    return model_flops + int(checkpointed_layers) * int(batch_size) * layer_forward


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of parameters, each shared tensor counted once."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"count_parameters needs an nn.Module (a model), got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


class TokenEmbedding(nn.Embedding):
    """Token ids (B, T) -> vectors (B, T, C) scaled by sqrt(C), with the ids checked first.

    Initialised with standard deviation C^-1/2, so the scaled vectors have unit size (nn.Embedding's
    default, N(0, 1), would make them of size sqrt(C)). An output layer that shares these weights scales
    its input back (:class:`OutputProjection`), so the first logits are of order 1.

    Rank, dtype, device and T >= 1 are checked always (they cost nothing: no data is read). The range of
    the ids only with ``check_ids`` and outside ``torch.compile``, because it reads the ids back: with it
    off an id out of range still fails, inside the lookup (an ``IndexError`` on the CPU, a device-side
    assert on a GPU), never silently.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, check_ids: bool = True):
        super().__init__(num_embeddings, embedding_dim)
        self._check_ids = bool(check_ids)

    @property
    def check_ids(self) -> bool:
        """Check that ids are in range (``TransformerConfig.check_token_ids``), fixed at construction. On a
        GPU reading the minimum and maximum back is a host sync each forward pass."""
        return self._check_ids

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.embedding_dim ** -0.5)
        self._fill_padding_idx_with_zero()

    def forward(self, ids: Tensor) -> Tensor:
        if ids.dim() != 2:
            raise ValueError(f"token ids must have shape (B, T), got {tuple(ids.shape)}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"token ids must be integers, torch.long (or int32), got {ids.dtype}: use .long()")
        if ids.shape[1] == 0:  # attention over no tokens has no answer (and no error to show it)
            raise ValueError(f"token ids must hold at least one token per sequence, got shape {tuple(ids.shape)}")
        if ids.device != self.weight.device:
            raise ValueError(f"token ids are on {ids.device} but the model is on {self.weight.device}: move the ids "
                             f"with .to('{self.weight.device}')")
        if self._check_ids and not torch.compiler.is_compiling() and ids.numel():
            low, high = int(ids.min()), int(ids.max())  # a host sync on a GPU: why check_ids can be turned off
            if low < 0 or high >= self.num_embeddings:
                raise ValueError(f"token ids must lie in [0, {self.num_embeddings}), got values from {low} to "
                                 f"{high}: check the vocabulary size in the config")
        return super().forward(ids) * math.sqrt(self.embedding_dim)


class OutputProjection(nn.Linear):
    """Vectors (B, T, C) -> logits (B, T, vocab_size); with ``tied_to`` an embedding, its weights, scaled.

    Why the scale: a :class:`TokenEmbedding` row e has entries of variance 1/C (so |e|^2 ~ 1) and enters the
    residual stream as sqrt(C) e; at initialisation the stream still carries it almost unchanged, and the
    final layer norm keeps it at unit-size entries. A tied projection then gives the input token the logit
    sqrt(C) e . e ~ sqrt(C) (8 for C = 64) and every other token sqrt(C) e . e_v ~ N(0, 1): the untrained
    model predicts "repeat the input" and starts far above the loss of an even guess, log(vocab_size).
    Multiplying the vectors by C^-1/2 before the tied projection (as T5 does when it ties its embeddings)
    brings the input token's logit to ~1 and the others to ~N(0, 1/C), and the
    first loss to about log(vocab_size). An untied projection keeps nn.Linear's initialisation and no scale.
    """

    def __init__(self, d_model: int, vocab_size: int, tied_to: nn.Embedding | None = None):
        super().__init__(d_model, vocab_size, bias=False)
        self.scale = 1.0
        if tied_to is not None:
            self.weight = tied_to.weight
            self.scale = d_model ** -0.5

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x * self.scale if self.scale != 1.0 else x)  # (B, T, C) -> (B, T, vocab_size)


def _check_padding_mask(mask: Tensor | None, like: Tensor, name: str, what: str = "its token ids") -> Tensor | None:
    """``mask`` must be None or a bool (B, T) tensor with the shape of ``like`` (B, T, ...), on its device."""
    if mask is None:
        return None
    if mask.shape != like.shape[:2]:
        raise ValueError(f"{name} must have the shape of {what} {tuple(like.shape[:2])}, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor, True at padding positions; got {mask.dtype}")
    if mask.device != like.device:
        raise ValueError(f"{name} is on {mask.device} but {what} on {like.device}: move it with .to('{like.device}')")
    return mask


def _check_memory(memory: Tensor, tgt: Tensor, model_dtype: torch.dtype) -> None:
    """The encoder's output as ``decode`` needs it: (B, S, C) floats, tgt's batch and device, the model's dtype
    (or any float dtype under autocast, which casts)."""
    if memory.dim() != 3 or memory.shape[0] != tgt.shape[0]:
        raise ValueError(f"memory must have shape (B, S, C) with B = {tgt.shape[0]}, got {tuple(memory.shape)}")
    if memory.shape[1] == 0:  # cross-attention over nothing gives zeros: a decoder that ignores its source
        raise ValueError("memory has no source positions (S = 0): encode a source of at least one token")
    if memory.device != tgt.device:
        raise ValueError(f"memory is on {memory.device} but tgt on {tgt.device}: put both on the model's device")
    if not memory.is_floating_point() or (memory.dtype != model_dtype
                                          and not torch.is_autocast_enabled(memory.device.type)):
        raise ValueError(f"memory is {memory.dtype} but the model computes in {model_dtype}: pass the output of "
                         "model.encode(src) (or convert it with .to(dtype))")


class Transformer(nn.Module):
    """Encoder-decoder Transformer: ``forward(src, tgt)`` -> logits (B, T_tgt, vocab_size).

    Padding masks are (B, T) bool tensors, True at padding positions.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = config
        self.tgt_embed = TokenEmbedding(c.vocab_size, c.d_model, c.check_token_ids)
        self.src_embed = (self.tgt_embed if c.share_src_tgt_embeddings
                          else TokenEmbedding(c.source_vocab_size, c.d_model, c.check_token_ids))
        self.src_pos = PositionalEncoding(c.d_model, c.max_len, c.positional)
        self.tgt_pos = self.src_pos if c.positional == "sinusoidal" else PositionalEncoding(c.d_model, c.max_len, c.positional)
        self.dropout = nn.Dropout(c.dropout)
        layer_args = (c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first, c.activation)
        fused = dict(fused_attention=c.fused_attention)
        self.encoder = LayerStack([EncoderLayer(*layer_args, **fused) for _ in range(c.n_encoder_layers)], c.d_model)
        self.decoder = LayerStack([DecoderLayer(*layer_args, **fused) for _ in range(c.n_decoder_layers)], c.d_model)
        self.generator = OutputProjection(c.d_model, c.vocab_size, self.tgt_embed if c.tie_embeddings else None)

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """Source ids (B, S) -> memory (B, S, C)."""
        src_padding_mask = _check_padding_mask(src_padding_mask, src, "src_padding_mask")
        x = self.dropout(self.src_pos(self.src_embed(src)))
        return self.encoder(x, padding_mask=src_padding_mask)

    def decode(self, tgt: Tensor, memory: Tensor, src_padding_mask: Tensor | None = None,
               tgt_padding_mask: Tensor | None = None) -> Tensor:
        """Target ids (B, T) and memory (B, S, C) -> logits (B, T, vocab_size); position t sees targets <= t."""
        tgt_padding_mask = _check_padding_mask(tgt_padding_mask, tgt, "tgt_padding_mask")
        _check_memory(memory, tgt, self.generator.weight.dtype)
        src_padding_mask = _check_padding_mask(src_padding_mask, memory, "src_padding_mask", "the memory")
        x = self.dropout(self.tgt_pos(self.tgt_embed(tgt)))
        x = self.decoder(x, memory, padding_mask=tgt_padding_mask, memory_padding_mask=src_padding_mask)
        return self.generator(x)  # (B, T, C) -> (B, T, vocab_size)

    def forward(self, src: Tensor, tgt: Tensor, src_padding_mask: Tensor | None = None,
                tgt_padding_mask: Tensor | None = None) -> Tensor:
        if src.dim() != 2 or tgt.dim() != 2 or src.shape[0] != tgt.shape[0]:
            raise ValueError(f"src and tgt must be (B, S) and (B, T) token ids with one B, got "
                             f"{tuple(src.shape)} and {tuple(tgt.shape)}")
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt, memory, src_padding_mask, tgt_padding_mask)


class DecoderLM(nn.Module):
    """Decoder-only (GPT-style) language model: ids (B, T) -> next-token logits (B, T, vocab_size)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = config
        self.embed = TokenEmbedding(c.vocab_size, c.d_model, c.check_token_ids)
        self.pos = PositionalEncoding(c.d_model, c.max_len, c.positional)
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = LayerStack([EncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first, c.activation,
                                               causal=True, fused_attention=c.fused_attention)
                                  for _ in range(c.n_decoder_layers)], c.d_model)
        self.lm_head = OutputProjection(c.d_model, c.vocab_size, self.embed if c.tie_embeddings else None)

    def forward(self, ids: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        x = self.embed(ids)  # checks the ids first
        padding_mask = _check_padding_mask(padding_mask, ids, "padding_mask")
        x = self.dropout(self.pos(x))
        return self.lm_head(self.blocks(x, padding_mask=padding_mask))  # (B, T, C) -> (B, T, vocab_size)
