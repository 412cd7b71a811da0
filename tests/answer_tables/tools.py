"""Chapter 16: the int8 checkpoint's size, a graph break removed, the wheel index for a driver."""

import torch

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import tools

SHARE, MEASURED = 0.716, 2.12  # the notebook's model: 71.6 % of its parameters in nn.Linear; torch.save measured
KEPT = (1 - SHARE) + SHARE / 4  # int8 bytes / float32 bytes


def int8_size(predicted):
    return tools.check_int8_size_prediction(predicted, MEASURED, linear_share=SHARE)


def clip_if_large(x):
    """The notebook's function: a Python branch on a tensor's value."""
    peak = x.abs().max()
    if peak.item() > 1:
        return x / peak
    return x


def clip_with_where(x):
    """The chapter's solution."""
    peak = x.abs().max()
    return torch.where(peak > 1, x / peak, x)


def clip_by_division(x):
    """Divide by max(peak, 1): the same outputs, one graph."""
    return x / torch.clamp(x.abs().max(), min=1.0)


def clip_without_item(x):
    """The .item() removed, the Python `if` kept: Dynamo still has to read the value to branch."""
    peak = x.abs().max()
    if peak > 1:
        return x / peak
    return x


def clip_by_max_not_abs(x):
    """Scaled by the largest value, not the largest |value|."""
    peak = x.max()
    return torch.where(peak > 1, x / peak, x)


def wheel(index_url):
    return tools.check_wheel_for_driver(index_url, driver_cuda="12.4")


URL = "https://download.pytorch.org/whl/"

TABLES = [
    Table(
        "check_int8_size_prediction", int8_size,
        right=(1 / KEPT, tools.predicted_int8_size_ratio(SHARE), round(1 / KEPT, 2)),
        wrong=(Wrong("a guess of 2x", 2, ("2x is not what the model gives", "1 / ((1 - s) + s / 4)")),
               Wrong("every weight int8", 4.0, ("stay float32",)),
               Wrong("upside down", KEPT, ("not (1 - s) + s / 4",)),
               Wrong("the share of bytes saved", 1 - KEPT, ("share of the bytes saved",)),
               Wrong("2-byte weights taken for float32", 1 / ((1 - SHARE) + SHARE / 2), ("4 times smaller, not 2",)),
               Wrong("linear bytes dropped entirely", 1 / (1 - SHARE), ("do not vanish",)),
               Wrong("the measured ratio copied", MEASURED, ("too low", "two decimals", "scales"))),
    ),
    Table(
        "check_graph_break_fixed", tools.check_graph_break_fixed,
        right=(clip_with_where, clip_by_division),
        wrong=(Wrong("the break left in", clip_if_large, ("break(s)", "torch.where")),
               Wrong("the .item() removed, the if kept", clip_without_item, ("break(s)", "torch.where")),
               Wrong("always scales", lambda x: x / x.abs().max(), ("differ", "only where it exceeds 1")),
               Wrong("clamps instead of scaling", lambda x: torch.clamp(x, -1, 1), ("differ",)),
               Wrong("largest value, not largest |value|", clip_by_max_not_abs, ("differ", "|value|")),
               Wrong("a tensor, not the function", clip_with_where(torch.ones(3)), ("your function itself",))),
    ),
    Table(
        "check_wheel_for_driver", wheel,
        right=(URL + "cu124", URL + "cu124/", f"  {URL}cu124 ", URL + "cu121", URL + "cu118"),
        wrong=(Wrong("the CPU wheel again", URL + "cpu", ("already has",)),
               Wrong("a newer minor CUDA", URL + "cu126", ("newer than the 12.4", "update the driver", "cu124")),
               Wrong("the newest CUDA", URL + "cu128", ("PTX", "cu124")),
               Wrong("a newer major CUDA", URL + "cu130", ("too old",)),
               Wrong("the driver's CUDA, a tag never published", URL + "cu122", ("publishes no", "cu124")),
               Wrong("the AMD build", URL + "rocm6.4", ("AMD",)),
               Wrong("PyPI's default wheel", "https://pypi.org/simple", ("PyPI", "newer than the 12.4")),
               Wrong("the whole pip command", f"pip install torch --index-url {URL}cu124", ("URL alone",)),
               Wrong("the bare tag", "cu124", ("download.pytorch.org/whl/<build>",)),
               Wrong("a number, not a string", 124, ("as a string",))),
    ),
]
