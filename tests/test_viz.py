"""viz's optional parts: the attention explorer degrades to still images where ipywidgets is missing."""

import sys

import torch

from gpuformer_lib import viz


def test_the_attention_explorer_without_ipywidgets_shows_every_head_and_says_why(monkeypatch):
    """A GPU node (or a bare Python) has no ipywidgets: chapter 3's explorer cell shows each head's heat-map and
    a line saying how to get the controls, instead of failing the notebook with ModuleNotFoundError."""
    weights = torch.rand(3, 4, 5).softmax(-1)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # importing it raises ImportError, as if not installed
    views = viz.attention_explorer(weights, list("abcd"), list("vwxyz"))
    assert isinstance(views, viz.StaticAttentionViews) and len(views.head_pngs) == 3
    assert all(png.startswith(b"\x89PNG") for png in views.head_pngs)
    html = views._repr_html_()
    assert html.count("<img") == 3 and "pip install ipywidgets" in html
    assert "ipywidgets is not installed" in repr(views)
