"""What an optimizer costs on a GPU: its state's bytes, the bytes one step moves, the logits' bytes.

- :func:`adamw_bytes_per_param`: weights + gradients + AdamW's two moments (+ float32 master weights under
  mixed precision). In float32: 4 + 4 + 8 = 16 B per parameter; with 16-bit weights and gradients and a
  float32 master copy: 2 + 2 + 12 = 16 B as well (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
  Toward Training Trillion Parameter Models", section 3.1: "2Ψ + 2Ψ + KΨ = 16Ψ bytes", K = 12).
- :func:`adamw_step_bytes`: the bytes one ``optimizer.step()`` reads and writes. A step is element-wise
  (a few FLOPs per parameter), so on a GPU it is memory-bound and its time is about bytes / bandwidth.
  The *fused* kernel reads weight, gradient and both moments once and writes weight and moments once:
  7 tensors x 4 B = 28 B per float32 parameter. The *foreach* (multi-tensor) implementation of
  ``torch.optim.AdamW`` runs eight element-wise passes over lists of tensors (decay, lerp of m, scale
  and addcmul of v, sqrt, divide, add eps, addcdiv), each one read-modify-write: 80 B per parameter.
  Counted from ``_multi_tensor_adam`` in ``torch/optim/adam.py`` (PyTorch 2.x, not capturable, no amsgrad).
- :func:`logits_bytes`: the (B, T, V) logits tensor, often the largest activation of a language model
  (GPT-2: 8 x 1024 x 50257 x 4 B = 1.5 GiB in float32), which chunked or fused cross-entropy never
  materialises whole.

Leaves out: the allocator's rounding and temporaries (the foreach path allocates one temporary tensor
list, the size of the weights, for sqrt(v)), and launch overhead (a few microseconds per kernel, which
dominates for a tiny model).
"""

from __future__ import annotations

import numbers

_FOREACH_PASSES = (
    # (what, tensors read, tensors written), per parameter, as _multi_tensor_adam does them
    ("w *= 1 - lr * wd", 1, 1),
    ("m = lerp(m, g, 1 - b1)", 2, 1),
    ("v *= b2", 1, 1),
    ("v += (1 - b2) g * g", 2, 1),
    ("s = sqrt(v)", 1, 1),
    ("s /= sqrt(bias correction 2)", 1, 1),
    ("s += eps", 1, 1),
    ("w += -step * m / s", 3, 1),
)


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def adamw_bytes_per_param(*, mixed_precision: bool = False) -> dict[str, int]:
    """Bytes per parameter of AdamW training, by kind: float32 weights, gradients and moments; or, under
    ``mixed_precision``, 16-bit weights and gradients with a float32 master copy and moments."""
    if not isinstance(mixed_precision, bool):
        raise TypeError(f"mixed_precision must be a bool, got {mixed_precision!r}")
    if mixed_precision:
        return {"weights": 2, "gradients": 2, "master weights": 4, "moments (m, v)": 8}
    return {"weights": 4, "gradients": 4, "master weights": 0, "moments (m, v)": 8}


def adamw_step_bytes(n_params: int, *, implementation: str = "fused", state_bytes: int = 4) -> int:
    """Bytes one AdamW step reads plus writes for ``n_params`` parameters whose weights, gradients and
    moments are ``state_bytes`` wide: 7 per parameter and byte for ``'fused'``, 20 for ``'foreach'``
    (see the module docstring). The for-loop implementation moves as much as foreach, one tensor at a time."""
    n_params, state_bytes = _count("n_params", n_params), _count("state_bytes", state_bytes)
    if implementation == "fused":
        transfers = 4 + 3  # read w, g, m, v; write w, m, v
    elif implementation == "foreach":
        transfers = sum(r + w for _, r, w in _FOREACH_PASSES)
    else:
        raise ValueError(f"implementation must be 'fused' or 'foreach', got {implementation!r}")
    return n_params * transfers * state_bytes


def logits_bytes(batch_size: int, seq_len: int, vocab_size: int, *, element_bytes: int = 4) -> int:
    """Bytes of one (B, T, V) logits tensor."""
    return (_count("batch_size", batch_size) * _count("seq_len", seq_len) * _count("vocab_size", vocab_size)
            * _count("element_bytes", element_bytes))


def adamw_step(n_params: int, implementation: str, device="cpu", *, n_tensors: int = 8):
    """One ``torch.optim.AdamW`` step over ``n_params`` float32 parameters in ``n_tensors`` tensors on
    ``device``, as a function of no arguments, with ``implementation`` ``'for-loop'`` (foreach=False),
    ``'foreach'`` or ``'fused'``; the state is created by a first step here, so every call of the function
    is a step like those of training (it reads and writes m and v)."""
    import torch

    n_params, n_tensors = _count("n_params", n_params), _count("n_tensors", n_tensors)
    if n_tensors < 1 or n_params < n_tensors:
        raise ValueError(f"need 1 <= n_tensors <= n_params, got n_tensors={n_tensors}, n_params={n_params}")
    flags = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
    if implementation not in flags:
        raise ValueError(f"implementation must be one of {sorted(flags)}, got {implementation!r}")
    g = torch.Generator().manual_seed(0)
    sizes = [n_params // n_tensors + (i < n_params % n_tensors) for i in range(n_tensors)]
    params = [torch.nn.Parameter(torch.randn(s, generator=g).to(device)) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(device)
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **flags[implementation])
    optimizer.step()  # creates m and v
    return optimizer.step


def time_adamw_step(n_params: int, implementation: str, device="cpu", *, n_tensors: int = 8, repeats: int = 10):
    """Time one ``torch.optim.AdamW`` step (:func:`adamw_step`) alone. Returns a ``bench.Timing`` (report its
    median). To compare implementations, use :func:`compare_adamw_steps`: interleaved rounds and a verdict."""
    from gpuformer_lib import bench

    step = adamw_step(n_params, implementation, device, n_tensors=n_tensors)
    return bench.time_fn(step, device=device, warmup=2, repeats=repeats)


def compare_adamw_steps(n_params: int, device="cpu", *, implementations=("foreach", "fused"), n_tensors: int = 8,
                        **timing):
    """Time AdamW steps of several ``implementations`` (the first is the baseline) over the same sizes with
    ``bench.compare``, in interleaved rounds; returns its ``bench.Comparison`` per candidate, by name (the
    verdict, not one run's ratio, says which was faster). ``timing`` goes to ``bench.time_interleaved``."""
    from gpuformer_lib import bench

    steps = {impl: adamw_step(n_params, impl, device, n_tensors=n_tensors) for impl in implementations}
    return bench.compare(steps, device=device, **timing)
