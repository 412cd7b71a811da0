"""Architecture diagrams drawn with matplotlib: the encoder-decoder Transformer of Vaswani et al. 2017
(their Figure 1), but in the pre-LN arrangement the library uses by default (the paper draws post-LN:
"Add & Norm" after each sublayer), with a final LayerNorm on each stack and the tied head's C^-1/2, with dropout marked where the
paper applies it (on each sublayer's output before the residual add, and on embeddings + positions).

Leaves out: decoder-only and encoder-only variants (drop one stack and the cross-attention), attention's
inner structure (chapter 3's and 4's figures).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

_COLOURS = {"attn": "#f6c28b", "ff": "#9ecae1", "norm": "#e5e5e5", "embed": "#c7e9c0", "out": "#d4b9da"}


def _box(ax, x, y, w, h, text, kind, fontsize=8):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=_COLOURS[kind], ec="black", lw=0.8))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, start, end, **kw):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, lw=0.8, color="black", **kw))


def _stack(ax, x, y0, sublayers, label, label_side=-1):
    """A pre-LN layer: for each sublayer, LayerNorm -> sublayer -> dropout -> add (a circled + on the
    residual path). ``label_side`` -1 puts the "layer x N" label left of the stack, +1 right. Returns the top y."""
    y = y0
    ax.add_patch(FancyBboxPatch((x - 1.35, y0 - 0.25), 2.7, 1.05 * len(sublayers) + 0.3,
                                boxstyle="round,pad=0.05", fc="none", ec="grey", ls="--", lw=0.8))
    for name, kind in sublayers:
        _box(ax, x, y + 0.1, 2.1, 0.3, "LayerNorm", "norm", 7)
        _box(ax, x, y + 0.5, 2.1, 0.36, name, kind)
        _arrow(ax, (x, y + 0.26), (x, y + 0.32))
        ax.plot([x - 1.2, x - 1.2], [y - 0.3, y + 0.8], color="dimgrey", lw=1.6)  # the residual path
        ax.plot([x - 1.05, x - 1.13], [y + 0.6, y + 0.7], color="dimgrey", lw=0.8)  # sublayer -> the add
        ax.add_patch(Circle((x - 1.2, y + 0.73), 0.1, fc="white", ec="dimgrey", lw=1.2, zorder=3))
        ax.text(x - 1.2, y + 0.73, "+", ha="center", va="center", fontsize=7, color="dimgrey", zorder=4)
        y += 1.05
    label_x = x - 1.65 if label_side < 0 else x + 2.05
    ax.text(label_x, (y0 + y) / 2, label, rotation=90 if label_side < 0 else 270, ha="center", va="center",
            fontsize=8)
    return y


def encoder_decoder_figure(figsize=(6, 7.5)):
    """The encoder-decoder Transformer, pre-LN, as a matplotlib figure (returned, not shown)."""
    fig, ax = plt.subplots(figsize=figsize)
    ax.set_xlim(-1.2, 6.5)
    ax.set_ylim(-1.6, 5.1)
    ax.axis("off")
    enc_x, dec_x = 0.8, 4.2
    # inputs
    _box(ax, enc_x, -1.3, 2.2, 0.4, "source ids (B, S)", "embed")
    _box(ax, enc_x, -0.55, 2.4, 0.5, "embedding $\\times\\sqrt{C}$\n+ positions, dropout", "embed", 7.5)
    _arrow(ax, (enc_x, -1.1), (enc_x, -0.8))
    _box(ax, dec_x, -1.3, 2.2, 0.4, "target ids (B, T)", "embed")
    _box(ax, dec_x, -0.55, 2.4, 0.5, "embedding $\\times\\sqrt{C}$\n+ positions, dropout", "embed", 7.5)
    _arrow(ax, (dec_x, -1.1), (dec_x, -0.8))
    # stacks
    top_enc = _stack(ax, enc_x, 0.2, [("self-attention", "attn"), ("feed-forward", "ff")], "encoder layer x N")
    top_dec = _stack(ax, dec_x, 0.2, [("causal self-attention", "attn"), ("cross-attention", "attn"),
                                      ("feed-forward", "ff")], "decoder layer x N", label_side=1)
    _arrow(ax, (enc_x, -0.3), (enc_x, 0.0))
    _arrow(ax, (dec_x, -0.3), (dec_x, 0.0))
    _box(ax, enc_x, top_enc + 0.2, 1.9, 0.3, "final LayerNorm", "norm", 7)
    _box(ax, dec_x, top_dec + 0.2, 1.9, 0.3, "final LayerNorm", "norm", 7)
    # memory -> cross-attention
    ax.annotate("", xy=(dec_x - 1.05, 1.75), xytext=(enc_x + 0.95, top_enc + 0.2),
                arrowprops=dict(arrowstyle="-|>", lw=1.0, color="tab:red", connectionstyle="arc3,rad=-0.2"))
    ax.text((enc_x + dec_x) / 2 - 0.75, top_enc + 0.5, "memory (B, S, C):\nkeys and values", fontsize=7,
            color="tab:red", ha="center")
    # output
    _box(ax, dec_x, top_dec + 0.95, 2.9, 0.55, "linear to vocabulary (tied\nto the embedding, $\\times C^{-1/2}$)", "out", 7)
    _arrow(ax, (dec_x, top_dec + 0.35), (dec_x, top_dec + 0.7))
    ax.text(dec_x, top_dec + 1.45, "logits (B, T, V) -> softmax / loss", ha="center", fontsize=8)
    ax.set_title("The encoder-decoder Transformer as this library builds it (pre-LN; grey line and (+): the residual "
                 "path, after dropout)", fontsize=9.5)
    return fig
