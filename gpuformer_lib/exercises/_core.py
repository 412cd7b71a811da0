"""What every exercise check shares: the result type, printing, and calling the learner's code safely.

A check must never be fooled, hang or crash, whatever the learner passes, so every call into learner
code goes through :func:`_try`, and every public ``check_*`` is wrapped by :func:`_safe_check`:

* ``_try`` gives the learner's function *copies* of the arguments (tensors cloned, lists and dicts
  copied, modules deep-copied) and reports an argument the function changed in place, so the check's
  expected value, computed from the untouched originals, cannot be changed by the answer;
* it runs the function under a time limit (``_isolation.TIME_LIMIT_S``, 10 s, or the environment variable
  ``GPUFORMER_CHECK_TIME_LIMIT`` in seconds, 0 for none) and reports an endless loop as a hint. The limit
  uses ``SIGALRM``, so it applies on Linux and macOS in the main thread (where a Jupyter kernel runs
  cells); on Windows, or in another thread, the function runs without a limit. A Python loop is
  interrupted at once; one long C call (a huge matmul, a GPU kernel) only when it returns;
* it turns an exception, ``None`` or a value of the wrong kind into one specific hint; what the learner's
  code returned is examined (compared with the inputs, converted by ``expect``) under the time limit too, since
  that calls the answer's own methods (a ``__float__`` or ``__eq__`` of the learner's);
* a check that calls the learner's code in any other way (a forward and backward through the learner's module,
  a library helper such as ``check_no_lookahead`` or ``torch._dynamo.explain`` that calls the learner's function)
  runs that code through :func:`_run_limited`, under the same limit (``tests/test_faults_exercises.py`` feeds
  every check that takes a function, a class or a kernel an answer that never returns);
* ``_safe_check`` turns anything that still goes wrong while the check examines the answer into a
  not-yet result that names what the answer was. ``KeyboardInterrupt`` still interrupts.

**The grading side channel.** When the environment variable ``GPUFORMER_GRADE_LOG`` names a file, every public
check, once it has its result, appends one JSON line to that file (opened, written, flushed and closed at once,
so a kernel that dies a moment later loses nothing): ``check`` (the public function's name, the exercise's
stable id), ``passed``, ``message`` (what was printed, the hint included), ``timed_out`` (true when the check
failed because the learner's function ran past the time limit), ``not_attempted`` (true when the check failed on
the stub's own placeholder: the learner's function still raised the stub's bare ``NotImplementedError``, or the
answer was still the stub's ``None``, ``...`` or ``"?"``, alone or as every value of a dict, list or tuple, such as
``{"T4": None}``), ``time`` (UTC, ISO 8601), ``execution_count``
(IPython's execution counter while the check ran, else null; for reading only: the grader attributes a line to
the cell that was running when it was written) and ``pid``. A check called by another check is recorded once,
as the outer one. ``make grade`` (:mod:`gpuformer_lib.tools.grade`) reads these lines instead of parsing printed
text. Without the variable nothing is written and nothing else changes.

**What the channel does not guarantee: a learner's own code can record any result.** The notebook runs the
learner's code in the same Python process as the checks, so code that sets out to forge a pass can do it: call
the writer itself, replace ``_report`` or a check, or write the file by other means (``exec`` of code compiled
under this file's name, ``ctypes``). The guards here are cheap ones against casual forging: ``_record`` refuses
a caller without a key held in the closure of :func:`_safe_check` (not a module global), the grader's sandbox
refuses other code opening the log, and only names of real checks that the instructor's copy calls are counted,
each attributed to the cell that ran it. What actually catches deliberate forging is a person: ``make grade``
flags every cell whose code uses the channel's internals, ``exec``/``compile``, ``ctypes`` or an audit hook, or
assigns to an attribute of a ``gpuformer_lib.exercises`` module (:mod:`gpuformer_lib.tools.review`; a ``flags``
column in ``grades.csv``, "review by hand" in the feedback). So a grade is trustworthy for learners who are not
trying to cheat, and a flagged cell must be read before the grade is trusted.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import functools
import json
import math
import numbers
import os
import sys
from typing import Any, Callable

import torch
from torch import Tensor, nn

from gpuformer_lib.exercises._isolation import (TIME_LIMIT_ENV, _call_with_time_limit, _changed, _copy,
                                                _in_place_hint, _time_limit_s, _TimeLimitExceeded)


class CheckResult:
    """The outcome of a check: truthy if it passed; ``message`` is what was printed."""

    def __init__(self, passed: bool, message: str):
        self.passed = passed
        self.message = message

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult(passed={self.passed}, message={self.message!r})"

    def _ipython_display_(self) -> None:
        """Show nothing more in a notebook: the check has printed its message already."""


def _report(ok: bool, message: str) -> CheckResult:
    text = ("✅ Correct. " if ok else "❌ Not yet. ") + message
    print(text)
    return CheckResult(ok, text)


class _CheckState:
    """What the running check knows: its name, and the last value the learner's code returned."""

    def __init__(self, name: str):
        self.name = name
        self.answered = False
        self.answer: Any = None
        self.timed_out = False  # the learner's code ran past the time limit (recorded as ``timed_out``)
        self.not_attempted = False  # the answer was the stub's placeholder (recorded as ``not_attempted``)


_STATE: contextvars.ContextVar[_CheckState | None] = contextvars.ContextVar("gpuformer_check", default=None)


def _state() -> _CheckState:
    return _STATE.get() or _CheckState("the check")


GRADE_LOG_ENV = "GPUFORMER_GRADE_LOG"
"""Environment variable naming the file that every check's result is appended to (see the module docstring)."""


def _public_name(name: str) -> str:
    """The exercise's public ``check_*`` for a checker it wraps (``predictions._grade``, called by every
    ``check_*_prediction``; an inner ``check``): the nearest caller named ``check_*`` in this package; else ``name``."""
    if name.startswith("check_"):
        return name
    package = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith("check_") and os.path.dirname(os.path.abspath(code.co_filename)) == package:
            return code.co_name
        frame = frame.f_back
    return name


def _execution_count() -> int | None:
    """The number of the notebook cell running now, if this is an IPython kernel."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) else None


def _grading_channel() -> tuple[Callable[..., None], Callable[[Callable[..., CheckResult]], Callable[..., Any]]]:
    """``_record`` and ``_safe_check``, sharing a key that lives only in this closure: ``_record`` refuses a call
    without it, so a learner's ``_record('check_x', CheckResult(True, ''))`` records nothing. (A cheap guard
    against casual forging, not a boundary: the key can still be dug out of the closure; see the module docstring.)"""
    key = object()

    def _record(name: str, result: CheckResult, _key: object = None, timed_out: bool = False,
                not_attempted: bool = False) -> None:
        """Append ``result`` of the check ``name`` to the grading log, if ``GPUFORMER_GRADE_LOG`` names one."""
        if _key is not key:
            raise PermissionError("only a check (a function wrapped by _safe_check) records its result")
        path = os.environ.get(GRADE_LOG_ENV)
        if not path:
            return
        line = json.dumps({"check": name, "passed": bool(getattr(result, "passed", False)),
                           "message": str(getattr(result, "message", "")), "timed_out": bool(timed_out),
                           "not_attempted": bool(not_attempted),
                           "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
                           "execution_count": _execution_count(), "pid": os.getpid()}, ensure_ascii=False)
        try:
            with open(path, "a", encoding="utf-8") as log:
                log.write(line + "\n")
                log.flush()
        except OSError as err:  # the grade is lost, the learner's run goes on
            print(f"(the check's result could not be recorded in {GRADE_LOG_ENV}={path}: {err})", file=sys.stderr)

    def _safe_check(check: Callable[..., CheckResult]) -> Callable[..., CheckResult]:
        """Wrap a public ``check_*``: whatever the answer, it returns a :class:`CheckResult` instead of raising."""

        @functools.wraps(check)
        def guarded(*args: Any, **kwargs: Any) -> CheckResult:
            outermost = _STATE.get() is None
            state = _CheckState(check.__name__)
            state.not_attempted = bool(args) and _placeholder(args[0])
            token = _STATE.set(state)
            try:
                result = check(*args, **kwargs)
            except Exception as err:  # an answer of a kind the check did not foresee: a hint, not a traceback
                result = _report(False, _unexpected_hint(check, state, args, err))
            finally:
                _STATE.reset(token)
            if not outermost:  # an inner check's time-out and placeholder are the outer one's too
                _state().timed_out |= state.timed_out
                _state().not_attempted |= state.not_attempted
            if outermost:
                failed = not getattr(result, "passed", False)
                _record(_public_name(check.__name__), result, key, timed_out=state.timed_out and failed,
                        not_attempted=state.not_attempted and failed and not state.timed_out)
            return result

        return guarded

    return _record, _safe_check


_record, _safe_check = _grading_channel()

_PLACEHOLDER_TEXT = ("", "?", "...")


def _placeholder(value: Any, depth: int = 0) -> bool:
    """Whether an answer is still a stub's placeholder: ``None``, ``...``, ``"?"`` (or an empty string), or a dict,
    list, tuple or set holding only placeholders (``{"T4": None, "H100 SXM": None}``, ``(None, {})``, ``set()``). A
    number, a tensor, a function or an object of the learner's own class never is (nothing of theirs is called)."""
    if value is None or value is Ellipsis:
        return True
    if type(value) is str:
        return value.strip() in _PLACEHOLDER_TEXT
    if type(value) in (dict, list, tuple, set) and depth < 4:
        items = value.values() if type(value) is dict else value
        return all(_placeholder(item, depth + 1) for item in items)
    return False


def _unexpected_hint(check: Callable[..., Any], state: _CheckState, args: tuple, err: Exception) -> str:
    if state.answered:
        what = f"what your function returned, {_describe(state.answer)}"
    else:
        what = f"your answer, {_describe(args[0])}" if args else "your answer"
    task = " ".join((check.__doc__ or "").split("\n\n")[0].replace("``", "").split())
    return f"The check could not use {what} ({type(err).__name__}: {_short(str(err))}). The exercise: {task}"


# --------------------------------------------------------------------------- calling the learner's code


_TIMED_OUT = "did not return within"


def _timed_out(hint: str | None) -> bool:
    """Whether a hint from :func:`_try` says the learner's code ran out of time."""
    return bool(hint) and _TIMED_OUT in hint


def _timed_out_hint(seconds: float, what: str = "Your function") -> str:
    _state().timed_out = True
    return (f"{what} {_TIMED_OUT} {seconds:g} s: an endless loop? (On a slow machine, set the environment "
            f"variable {TIME_LIMIT_ENV} to more seconds.)")


NOT_IMPLEMENTED_HINT = "The function still raises NotImplementedError: replace that line with your code."


def _stub_raised() -> str:
    """The hint for the stub's own bare ``raise NotImplementedError``, noting that the exercise was not attempted."""
    _state().not_attempted = True
    return NOT_IMPLEMENTED_HINT


def _run_limited(call: Callable[..., Any], *args: Any, time_scale: float = 1.0,
                 what: str = "Your code") -> tuple[Any, str | None]:
    """Run the check's own ``call(*args)``, which calls into the learner's code in a way :func:`_try` cannot (a
    forward and backward through the learner's module, a helper that calls the learner's function), under the time
    limit times ``time_scale``. Returns ``(value, None)``, or ``(None, hint)`` when it ran out of time (recorded
    as ``timed_out``); an exception goes to the caller, which says what raised. Import what ``call`` needs before
    calling this: an import interrupted half-way stays broken for the rest of the process."""
    try:
        seconds = _time_limit_s() * time_scale
    except ValueError as err:
        return None, str(err)
    try:
        return _call_with_time_limit(call, args, seconds), None
    except _TimeLimitExceeded:
        return None, _timed_out_hint(seconds, what)


def _try(fn: Callable[..., Any], *args: Any, expect: Callable[[Any], tuple[Any, str | None]] | None = None,
         none_ok: bool = False, time_scale: float = 1.0) -> tuple[Any, str | None]:
    """Call the learner's ``fn`` on copies of ``args``, under the time limit (see the module docstring)
    times ``time_scale`` (more for a call that may legitimately be slow, such as compiling a kernel).

    Returns ``(value, None)``, or ``(None, hint)`` if ``fn`` is not a function, raised, did not return in
    time, changed an argument in place, returned None (unless ``none_ok``) or returned a value that
    ``expect`` (a converter from ``_answers`` such as ``_number``, which may also convert it) rejects.
    Examining the value (the comparison with the inputs, ``expect``) runs under the time limit too: it calls
    the methods of what the learner's code returned.
    """
    if not callable(fn):
        name = _state().name
        return None, (f"Pass your function itself, e.g. {name}(my_function), not what calling it returns; "
                      f"{name} got {_describe(fn)}.")
    try:
        seconds = _time_limit_s() * time_scale
    except ValueError as err:
        return None, str(err)
    copies = tuple(_copy(arg) for arg in args)
    try:
        value = _call_with_time_limit(fn, copies, seconds)
    except _TimeLimitExceeded:
        return None, _timed_out_hint(seconds)
    except NotImplementedError as err:
        if not str(err):  # the exercise's placeholder, not an operation torch lacks
            return None, _stub_raised()
        return None, _raised_hint(err, args)
    except SystemExit:
        return None, "Your function called exit(): return the answer instead."
    except Exception as err:  # the learner's code may raise anything; show it, don't crash
        return None, _raised_hint(err, args)
    state = _state()
    state.answered, state.answer = True, value

    def examine() -> tuple[Any, str | None]:
        for index, (original, given) in enumerate(zip(args, copies)):
            if _changed(original, given):
                return None, _in_place_hint(fn, index, original)
        if value is None and not none_ok:
            return None, "Your function returns None: did you forget `return`?"
        return expect(value) if expect else (value, None)

    try:
        return _call_with_time_limit(examine, (), seconds)
    except _TimeLimitExceeded:
        return None, _timed_out_hint(seconds, f"What your function returned (a {type(value).__name__}), examined,")


def _raised_hint(err: BaseException, args: tuple) -> str:
    where = f" (for arguments {', '.join(map(_brief, args))})" if args else ""
    return f"Your function raised {type(err).__name__}: {err}{where}."


# --------------------------------------------------------------------------- describing values in hints


def _describe(value: Any) -> str:
    """A short description of any value for a hint: its kind, and its shape or value."""
    if value is None:
        return "None"
    if isinstance(value, Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{'an' if dtype.startswith('i') else 'a'} {dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, str):
        return f"the string {_short(repr(value))}"
    if isinstance(value, bool):
        return f"the bool {value}"
    if isinstance(value, numbers.Number):
        return f"the number {_short(repr(value))}"
    if isinstance(value, (list, tuple, dict)):
        kinds = ", ".join(sorted({type(item).__name__ for item in value})) or "empty"
        return f"a {type(value).__name__} of {len(value)} ({kinds})"
    if isinstance(value, nn.Module):
        return f"a {type(value).__name__} module"
    if isinstance(value, torch.Generator):
        return "a torch.Generator"
    if callable(value) and hasattr(value, "__name__"):
        return f"the function {value.__name__}"
    return f"a {type(value).__name__} ({_short(_repr(value))})"


def _brief(value: Any) -> str:
    """An argument, as a hint shows it: small values in full, tensors and functions described."""
    if isinstance(value, (Tensor, nn.Module, torch.Generator)) or callable(value):
        return _describe(value)
    return _short(_repr(value), 60)


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - a learner's object with a broken __repr__
        return f"<{type(value).__name__}>"


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _close(a: Any, b: float, rel: float = 1e-6) -> bool:
    try:
        return math.isclose(float(a), b, rel_tol=rel)
    except (TypeError, ValueError, RuntimeError):  # not a number: a tensor of many elements, a string, ...
        return False
