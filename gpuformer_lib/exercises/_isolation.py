"""Running the learner's code in isolation: on copies of its arguments, noticing any it changed in
place, and under a time limit. :func:`gpuformer_lib.exercises._core._try` puts these together."""

from __future__ import annotations

import copy
import inspect
import math
import os
import signal
import sys
import sysconfig
import threading
import time
from typing import Any, Callable

import torch
from torch import Tensor, nn

TIME_LIMIT_S = 10.0
"""Seconds one call into the learner's code may take before the check reports an endless loop."""

TIME_LIMIT_ENV = "GPUFORMER_CHECK_TIME_LIMIT"
"""Environment variable that overrides :data:`TIME_LIMIT_S` (e.g. 60 on a slow machine; 0 turns the limit off)."""


# --------------------------------------------------------------------------- the time limit


class _TimeLimitExceeded(BaseException):
    """Raised inside the learner's code when its time is up. Not an ``Exception``, so that an
    ``except Exception`` in the learner's loop cannot swallow it. A bare ``except:`` could, so once the
    time is up a handler of the learner's that caught it raises it again (see :func:`_raise_in_handlers`). The
    clean-up of library code (``torch.no_grad``'s ``__exit__``, a ``finally`` in torch or the checks) runs to
    its end, so that a learner's loop inside ``with torch.no_grad():`` does not leave autograd off for the rest of
    the notebook."""


def _time_limit_s() -> float:
    raw = os.environ.get(TIME_LIMIT_ENV, "").strip()
    if not raw:
        return TIME_LIMIT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"{TIME_LIMIT_ENV}={raw!r} is not a number of seconds: set it to e.g. 60 on a slow "
                         f"machine, to 0 for no limit, or unset it for the default {TIME_LIMIT_S:g} s.")
    return seconds


_caller_frame: Any = None  # the frame of _call_with_time_limit while a limited call runs
_AGAIN_EVERY_S = 0.2  # once the time is up, the limit is raised again this often until the call ends


def _library_roots() -> tuple[str, ...]:
    """Where library code lives: the standard library, the installed packages, and this course's library."""
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # gpuformer_lib
    roots |= {path for name, path in sysconfig.get_paths().items() if name in ("stdlib", "platstdlib", "purelib",
                                                                              "platlib") and path}
    return tuple(os.path.join(os.path.abspath(root), "") for root in sorted(roots))


_LIBRARY_ROOTS = _library_roots()
_library_cache: dict[Any, bool] = {}


def _is_library(code: Any) -> bool:
    """Whether ``code`` is library code (whose clean-up must run), not the learner's (a notebook cell, their file)."""
    known = _library_cache.get(code)
    if known is None:
        name = code.co_filename
        known = name.startswith("<frozen") or os.path.abspath(name).startswith(_LIBRARY_ROOTS)
        _library_cache[code] = known
    return known


def _trace_learner_frames(frame: Any) -> None:
    """Trace ``frame`` and the frames below it down to the limited call's own, and every frame started from now."""
    while frame is not None and frame is not _caller_frame:
        frame.f_trace, frame.f_trace_lines = _raise_in_handlers, True
        frame = frame.f_back
    sys.settrace(_raise_in_handlers)


def _raise_in_handlers(frame: Any, event: str, arg: Any) -> Any:
    """The trace function of the learner's code once its time is up: a line of the learner's run while handling
    the limit (the ``pass`` of an ``except: pass``) raises it again, so a handler cannot swallow it. Library code
    (an ``__exit__`` or ``finally`` of torch's or the standard library's) is left to finish its clean-up."""
    if event == "line" and sys.exc_info()[0] is _TimeLimitExceeded and not _is_library(frame.f_code):
        raise _TimeLimitExceeded
    return _raise_in_handlers


def _keep_tracing(frame: Any, event: str, arg: Any) -> None:
    """The profile function once the time is up. A trace function that raises is switched off; this one is
    called on every call and return (a frame left by the limit, say) and switches it on again."""
    if sys.gettrace() is None:
        _trace_learner_frames(frame)


def _on_alarm(signum: int, frame: Any) -> None:
    if frame is _caller_frame or frame.f_code in _OWN_CODE:
        return  # the call is being tidied up, or the alarm landed in the functions above: try at the next one
    if sys.exc_info()[0] is _TimeLimitExceeded and _is_library(frame.f_code):
        return  # the limit is on its way out already, through library clean-up: let that finish
    _trace_learner_frames(frame)
    sys.setprofile(_keep_tracing)
    raise _TimeLimitExceeded


_OWN_CODE = {f.__code__ for f in (_trace_learner_frames, _raise_in_handlers, _keep_tracing, _on_alarm)}


def _call_with_time_limit(fn: Callable[..., Any], args: tuple, seconds: float) -> Any:
    """``fn(*args)``, interrupted by :class:`_TimeLimitExceeded` after ``seconds`` (0: never). Without
    SIGALRM (Windows) or outside the main thread it runs without a limit. The previous SIGALRM handler,
    timer, trace and profile functions are restored; a timer already running that would fire first
    (pytest-timeout, say) stays in charge. A loop that swallows the limit in two handlers of the same
    function (``try: try: ... except: pass except: pass``) can still run on: interrupt the kernel."""
    global _caller_frame
    if seconds <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        return fn(*args)
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    if 0 < outer_delay <= seconds:
        return fn(*args)
    outer_handler = signal.signal(signal.SIGALRM, _on_alarm)
    outer_trace, outer_profile, outer_caller = sys.gettrace(), sys.getprofile(), _caller_frame
    _caller_frame = sys._getframe()
    start = time.monotonic()
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds, _AGAIN_EVERY_S)
            return fn(*args)
        finally:  # this frame is never traced, and an alarm that lands here returns at once
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.setprofile(outer_profile)  # before the trace function, which the profile function would restore
            sys.settrace(outer_trace)
    finally:
        _caller_frame = outer_caller
        signal.signal(signal.SIGALRM, signal.SIG_DFL if outer_handler is None else outer_handler)
        if outer_delay > 0:  # give the outer timer back what it had left
            signal.setitimer(signal.ITIMER_REAL, max(outer_delay - (time.monotonic() - start), 1e-3), outer_interval)


# --------------------------------------------------------------------------- arguments changed in place


def _copy(value: Any) -> Any:
    """A copy of an argument that the learner's code may change without touching ``value``. Generators
    and functions (a callback such as ``fits``) are passed as they are: they are meant to be used."""
    if isinstance(value, Tensor):
        copied = value.detach().clone()
        return copied.requires_grad_() if value.requires_grad else copied
    if isinstance(value, nn.Module):
        return copy.deepcopy(value)
    if isinstance(value, (torch.Generator, type)) or callable(value):
        return value
    if isinstance(value, list):
        return [_copy(item) for item in value]
    if type(value) is tuple:
        return tuple(_copy(item) for item in value)
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an object that cannot be copied is compared, not protected
        return value


def _changed(original: Any, given: Any) -> bool:
    """Whether the learner's code changed ``given``, its copy of ``original``."""
    if isinstance(original, Tensor):
        return not (isinstance(given, Tensor) and _equal_tensors(original, given))
    if isinstance(original, nn.Module):
        before, after = original.state_dict(), given.state_dict()
        return before.keys() != after.keys() or any(_changed(before[k], after[k]) for k in before)
    if isinstance(original, (list, tuple)):
        return type(original) is not type(given) or len(original) != len(given) or any(map(_changed, original, given))
    if isinstance(original, dict):
        return original.keys() != given.keys() or any(_changed(original[k], given[k]) for k in original)
    if isinstance(original, torch.Generator) or callable(original):
        return False
    try:
        return bool(original != given)
    except Exception:  # noqa: BLE001 - no way to compare: assume unchanged
        return False


def _equal_tensors(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])  # NaN equals NaN here


def _in_place_hint(fn: Callable[..., Any], index: int, original: Any) -> str:
    try:
        parameters = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # a built-in without a signature
        parameters = []
    name = parameters[index].name if index < len(parameters) else None
    label, code = (name, name) if name else (f"its argument {index + 1}", "x")
    if isinstance(original, Tensor):
        how = f"compute a new tensor instead of `{code}.mul_(...)`, `{code} += ...` or `{code}[...] = ...` on an input"
    elif isinstance(original, nn.Module):
        how = f"call {code} as it is; do not change its weights or replace its parts"
    elif isinstance(original, list):
        how = f"build a new list, e.g. sorted({code}) instead of {code}.sort(), or {code} + [...] instead of append"
    else:
        how = f"build a new {type(original).__name__} instead of changing {code}"
    return (f"Your function changed {label} in place: the caller's {label} must stay as it was (the check computes "
            f"the expected answer from it). Leave inputs alone: {how}.")
