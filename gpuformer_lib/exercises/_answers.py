"""Converters for ``_try(..., expect=...)``: accept an answer of the kind an exercise asks for (a number,
True or False, a pair of numbers or tensors, a list of indices), in the forms a learner may fairly
return it (a Python number or a one-element tensor, a list or a tuple), or give the hint that says
what came back instead."""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from gpuformer_lib.exercises._core import _describe


def _number(value: Any) -> tuple[Any, str | None]:
    """A Python number, or a one-element real tensor as its Python value; otherwise a hint."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            return None, f"Return one number, not {_describe(value)}."
        return value.item(), None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return value, None
    return None, f"Return a number, not {_describe(value)}."


def _truth(value: Any) -> tuple[bool | None, str | None]:
    """True or False (also from a number or a one-element tensor); otherwise a hint."""
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex():
        return bool(value.item()), None
    if isinstance(value, (bool, np.bool_, numbers.Real)):  # numpy's bool is not a numbers.Real
        return bool(value), None
    return None, f"Return True or False, not {_describe(value)}."


def _bool(value: Any) -> tuple[bool | None, str | None]:
    """True or False strictly (also numpy's bool or a one-element bool tensor, which comparisons of
    arrays and tensors return), not a number that happens to be truthy; otherwise a hint."""
    if isinstance(value, Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        return bool(value.item()), None
    if isinstance(value, (bool, np.bool_)):
        return bool(value), None
    return None, f"Return True or False, not {_describe(value)}."


def _numbers(count: int, what: str) -> Callable[[Any], tuple[tuple | None, str | None]]:
    """A converter for ``expect``: a tuple or list of ``count`` numbers, e.g. ``what`` = 'a pair (mfu, hfu)'."""

    def convert(value: Any) -> tuple[tuple | None, str | None]:
        if not isinstance(value, (tuple, list)) or len(value) != count:
            return None, f"Return {what}, not {_describe(value)}."
        converted = tuple(_number(item) for item in value)
        bad = [item for item, (_, err) in zip(value, converted) if err]
        if bad:
            return None, f"Return {what}, each a number, not {_describe(bad[0])}."
        return tuple(number for number, _ in converted), None

    return convert


def _tensors(count: int, what: str) -> Callable[[Any], tuple[tuple | None, str | None]]:
    """A converter for ``expect``: a tuple or list of ``count`` tensors, e.g. ``what`` = 'two tensors (x, y)'."""

    def convert(value: Any) -> tuple[tuple | None, str | None]:
        if not isinstance(value, (tuple, list)) or len(value) != count:
            return None, f"Return {what}, not {_describe(value)}."
        bad = [item for item in value if not isinstance(item, Tensor)]
        if bad:
            return None, f"Return {what}, each a tensor, not {_describe(bad[0])}."
        return tuple(value), None

    return convert


def _indices(value: Any) -> tuple[list[int] | None, str | None]:
    """A list, tuple or 1-D integer tensor of indices as a list of Python ints; otherwise a hint."""
    hint = f"Return a list of indices (ints), not {_describe(value)}."
    if isinstance(value, np.ndarray):  # numpy's argsort and friends
        if value.ndim != 1 or value.dtype.kind not in "iu":
            return None, hint
        return [int(item) for item in value], None
    if isinstance(value, Tensor):
        if value.dim() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            return None, hint
        return value.tolist(), None
    if not isinstance(value, (list, tuple)):
        return None, hint
    out = []
    for item in value:
        if isinstance(item, Tensor) and item.dim() == 0:
            item = item.item()
        if not isinstance(item, numbers.Integral) or isinstance(item, bool):
            return None, f"Return a list of indices (ints), not a list holding {_describe(item)}."
        out.append(int(item))
    return out, None


def _index_batches(value: Any) -> tuple[list[list[int]] | None, str | None]:
    """A list of batches, each a list of indices, as lists of Python ints; otherwise a hint."""
    if not isinstance(value, (list, tuple)):
        return None, f"Return a list of batches, each a list of indices, not {_describe(value)}."
    batches = []
    for batch in value:
        indices, err = _indices(batch)
        if err:
            return None, f"Return a list of batches, each a list of indices (ints); one batch is {_describe(batch)}."
        batches.append(indices)
    return batches, None
