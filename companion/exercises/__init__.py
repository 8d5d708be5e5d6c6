"""Checkers for the chapters' exercises: run a learner's function against the reference and say what
is wrong, not only pass / fail.

    from companion.exercises import check
    check("ch01.masked_softmax", my_masked_softmax)      # prints what passed, raises on a mismatch

A checker draws fresh random inputs (several shapes, edge cases such as a fully masked row), calls
the learner's function and the reference on the same inputs, and compares them. A failure raises
``ExerciseFailed`` whose message names the case, what was expected and what came back: a wrong
shape, a masked entry that got weight, a NaN, the largest difference and where it is.

What this package provides
- ``check(name, fn, *, seed=None, time_limit=TIME_LIMIT)``: run the checker registered as ``name``;
  returns a ``Report``. Each call of ``fn`` (one per case) has ``time_limit`` seconds (default 10;
  None: no limit); a call that runs longer fails the check as ``TimeLimitExceeded``, naming the case.
  With a limit the check runs in a forked child process (where fork exists and CUDA is not in use),
  which is killed when a call outlives its limit by a second: an answer that swallows the in-process
  interruption (a bare ``except:``, a ``finally:`` that loops) cannot hang the notebook, and nothing
  the answer does in the child touches the caller's variables. An answer of the wrong kind (a string,
  a list where a tensor belongs) fails the check too, not with a TypeError from the checker.
- ``checkers()``: the registered names, by chapter.
- ``ExerciseFailed``: the error a failed check raises (a subclass of ``AssertionError``);
  ``TimeLimitExceeded``, its subclass for an answer that did not return in time. Printed for the
  page, ``failure.wrapped()`` keeps every line within ``WIDTH`` (88) characters, as a ``Report`` does.
- ``wrap_lines(text)``: any printed text (a model's summary, a sample) held to ``WIDTH`` characters
  a line, the most a code cell's output shows in the book's column without scrolling.
- ``register(name)``: the decorator chapters' checker modules (``companion.exercises.ch01`` ...) use.
- ``compare(case, got, expected, ...)``: the shared tensor comparison with a diagnosis; ``call(case, fn, ...)``
  runs the learner's function and turns its exception into a failure that names the case;
  ``diagnose(case, got, expected, mistakes)`` also names the known mistake a wrong answer reproduces;
  ``integer_answer(case, got)`` and ``diagnose_integer(case, got, expected, mistakes)`` do the same
  for answers that are counts (bytes, parameters, slots).
"""

from __future__ import annotations

import contextlib
import importlib
import numbers
import os
import pickle
import pkgutil
import select
import signal
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["check", "checkers", "register", "compare", "diagnose", "call", "ExerciseFailed", "TimeLimitExceeded",
           "Report", "integer_answer", "diagnose_integer", "TIME_LIMIT", "WIDTH", "wrap_lines"]

_REGISTRY: dict[str, Callable] = {}
WIDTH = 88  # characters of an output line on the rendered page (CONTRIBUTING.md, "Code width")
TIME_LIMIT = 10.0  # seconds per call of the learner's function (check's default)


class ExerciseFailed(AssertionError):
    """A learner's answer disagreed with the reference; the message says where and how."""

    def wrapped(self, width: int = WIDTH) -> str:
        """The message with each line longer than ``width`` wrapped (continuations indented by two
        spaces): what a printed failure shows in a code cell's output without scrolling. ``str()``
        keeps the message as it was raised, one line per diagnosis."""
        return wrap_lines(str(self), width)


class TimeLimitExceeded(ExerciseFailed):
    """A call of the learner's function did not return within the check's ``time_limit``."""


class _OutOfTime(BaseException):
    """Raised inside the learner's function by the alarm (a BaseException: ``except Exception`` in
    the learner's code does not swallow it)."""


class _Limited:
    """The learner's function with a time limit on every call: SIGALRM interrupts it in the main
    thread; elsewhere (no signals there) it runs in a daemon thread that is abandoned when late.
    Inside ``_isolated``'s child process each call is also announced to the parent (``_announce``),
    which kills the child when an answer swallows the interruption (a bare ``except:``)."""

    def __init__(self, fn: Callable, seconds: float):
        self.fn, self.seconds = fn, seconds
        self.__name__ = getattr(fn, "__name__", "fn")

    def _late(self) -> TimeLimitExceeded:
        return TimeLimitExceeded(f"your function did not return within {self.seconds:g} s (an endless loop? "
                                 "check(..., time_limit=...) allows more)")

    def __call__(self, *args, **kwargs):
        _announce(("call", _CASE[0]))
        try:
            return self._call(*args, **kwargs)
        finally:
            _announce(("done", None))

    def _call(self, *args, **kwargs):
        if hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread():
            def alarm(signum, frame):
                raise _OutOfTime

            previous = signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            try:
                return self.fn(*args, **kwargs)
            except _OutOfTime:
                raise self._late() from None
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
        result: dict = {}

        def run():
            try:
                result["value"] = self.fn(*args, **kwargs)
            except BaseException as e:  # handed back to the caller's thread
                result["error"] = e

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(self.seconds)
        if worker.is_alive():
            raise self._late()
        if "error" in result:
            raise result["error"]
        return result.get("value")


_CASE: list[str | None] = [None]  # the case ``call`` is running (named when the parent must kill a late answer)
_PIPE: list[int | None] = [None]  # in ``_isolated``'s child: the pipe to the parent
_GRACE_S = 1.0  # how long past the limit the parent waits for the child's own alarm before it kills the child


def _send(fd: int, message) -> None:
    data = pickle.dumps(message)
    os.write(fd, len(data).to_bytes(8, "little") + data)


def _announce(message) -> None:
    if _PIPE[0] is not None:
        _send(_PIPE[0], message)


def _receive(fd: int, timeout: float | None):
    """The next message from the child (None: it closed the pipe), or TimeoutError."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        raise TimeoutError
    head = _read_exactly(fd, 8)
    return None if head is None else pickle.loads(_read_exactly(fd, int.from_bytes(head, "little")) or b"")


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks = b""
    while len(chunks) < n:
        chunk = os.read(fd, n - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return chunks


def _can_fork() -> bool:
    """A forked child can run the check: fork exists, and CUDA is not initialised (a forked child
    cannot use it)."""
    return hasattr(os, "fork") and hasattr(select, "select") and not torch.cuda.is_initialized()


def _isolated(name: str, checker: Callable, fn: _Limited, gen: torch.Generator, report: Report) -> None:
    """Run ``checker(fn, gen, report)`` in a forked child process, and kill the child when a call of
    the learner's function outlives its limit by ``_GRACE_S``.

    Why a process: the limit inside a process is an exception raised by SIGALRM, and an answer that
    loops inside a bare ``except:`` (or a ``try``/``finally`` that loops) catches it and goes on; no
    signal a process survives can stop such code. Killing a child can: the kernel, the notebook and
    its variables are untouched. The child announces each call (and the case it checks); its own alarm
    still ends an ordinary endless loop with the usual message, and its verdict (the cases passed, or
    the exception) comes back through a pipe."""
    read, write = os.pipe()
    for stream in (sys.stdout, sys.stderr):  # else the child inherits the parent's unwritten output and
        with contextlib.suppress(Exception):  # writes it a second time when it flushes its own
            stream.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "fork in a multi-threaded process" (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: run the check, send the verdict, leave without running the parent's cleanup
        code = 0
        try:
            os.close(read)
            _PIPE[0] = write
            try:
                checker(fn, gen, report)
                verdict = ("ok", report.cases)
            except BaseException as e:  # noqa: B036 (handed to the parent, which raises it)
                verdict = ("error", e)
            try:
                _send(write, verdict)
            except Exception:  # an exception that does not pickle: its text
                _send(write, ("error", ExerciseFailed(f"{name}: {type(verdict[1]).__name__}: {verdict[1]}")))
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
        except BaseException:  # noqa: B036
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    case, deadline, verdict = None, None, None
    try:
        while True:
            try:
                message = _receive(read, None if deadline is None else max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise TimeLimitExceeded(
                    (f"{case}: " if case else "") + f"your function did not return within {fn.seconds:g} s and "
                    "caught the checker's interruption (a bare except: or a finally: that loops?), so its process "
                    "was stopped; check(..., time_limit=...) allows more") from None
            if message is None:
                break
            kind, value = message
            if kind == "call":
                case, deadline = value, time.monotonic() + fn.seconds + _GRACE_S
            elif kind == "done":
                deadline = None
            else:
                verdict = message
    finally:
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if verdict is None:
        raise ExerciseFailed((f"{case}: " if case else f"{name}: ") + "your function ended the checker's process "
                             "(os._exit, a crash in native code?) before the check finished")
    kind, value = verdict
    if kind == "error":
        raise value
    report.cases[:] = value


def wrap_lines(text: str, width: int = WIDTH) -> str:
    """``text`` with every line longer than ``width`` wrapped, its continuations indented two spaces
    more than the line itself; shorter lines (and so text wrapped before) are left as they are."""

    def fill(line: str) -> str:
        indent = line[: len(line) - len(line.lstrip())] + "  "
        return textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False)

    return "\n".join(line if len(line) <= width else fill(line) for line in text.split("\n"))


@dataclass
class Report:
    """What a passed check ran: the exercise's name and one line per case."""

    name: str
    cases: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        # one case a line, wrapped to the 88 characters a code cell's output shows without scrolling
        lines = [f"{self.name}: all {len(self.cases)} cases pass"]
        lines += [textwrap.fill(case, WIDTH, initial_indent="  - ", subsequent_indent="    ") for case in self.cases]
        return "\n".join(lines)


def register(name: str):
    """Register ``fn(learner_fn, generator, report)`` as the checker of exercise ``name``."""
    if not isinstance(name, str) or "." not in name:
        raise ValueError(f"name must be 'chapter.exercise' (e.g. 'ch01.masked_softmax'); got {name!r}")

    def wrap(fn):
        if name in _REGISTRY:
            raise ValueError(f"checker {name!r} is registered twice")
        _REGISTRY[name] = fn
        return fn

    return wrap


def _load_all() -> None:
    import companion.exercises as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{info.name}")


def checkers() -> list[str]:
    """Every registered exercise name, sorted (chapter first)."""
    _load_all()
    return sorted(_REGISTRY)


def check(name: str, fn: Callable, *, seed: int | None = None, quiet: bool = False,
          time_limit: float | None = TIME_LIMIT) -> Report:
    """Check the learner's ``fn`` for exercise ``name`` on fresh random inputs.

    ``seed`` fixes the inputs (None: a new draw each call, so an answer cannot be tuned to one input).
    ``time_limit``: seconds each call of ``fn`` may take (None: no limit); a call that takes longer
    fails the check (``TimeLimitExceeded``, naming the case) instead of waiting forever.
    Prints the report unless ``quiet``; raises ``ExerciseFailed`` with a diagnosis on the first failing
    case, and ``ValueError`` for an unknown name, a non-callable ``fn`` or a bad ``time_limit``.
    """
    _load_all()
    if name not in _REGISTRY:
        close = [n for n in _REGISTRY if n.split(".")[0] == str(name).split(".")[0]]
        raise ValueError(f"name must be a registered exercise; got {name!r}. Known: {close or sorted(_REGISTRY)}")
    if not callable(fn):
        raise ValueError(f"fn must be a function (your answer); got {type(fn).__name__}")
    if time_limit is not None:
        if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit < float("inf"):
            raise ValueError(f"time_limit must be a number of seconds > 0, or None for no limit; got {time_limit!r}")
        fn = _Limited(fn, float(time_limit))
    gen = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(0, 2**31 - 1, ()).item()))
    report = Report(name)
    try:
        if time_limit is not None and _PIPE[0] is None and _can_fork():
            _isolated(name, _REGISTRY[name], fn, gen, report)  # a limit the answer cannot swallow
        else:
            _REGISTRY[name](fn, gen, report)
    except (TypeError, AttributeError, IndexError, KeyError, RuntimeError) as e:
        # raised by the checker's own handling of the answer (errors inside the answer are already
        # ExerciseFailed, from ``call``): an answer of the wrong kind, a list where a tensor belongs
        raise ExerciseFailed(f"{name}: your answer could not be checked ({type(e).__name__}: {e}); does your "
                             "function return what the exercise asks for?") from e
    if not quiet:
        print(report)
    return report


def compare(case: str, got, expected: Tensor, *, atol: float = 1e-5, rtol: float = 1e-4,
            zero_where: Tensor | None = None, zero_what: str = "masked entries") -> None:
    """Raise ``ExerciseFailed`` unless ``got`` is a tensor close to ``expected``.

    The diagnosis, in the order a learner should fix things: not a tensor; wrong shape; NaN or inf
    where the reference is finite; anything but the same infinity where the reference is +-inf;
    non-zero values where ``zero_where`` is True (e.g. weight on a masked key); otherwise the largest
    difference and its index.
    """
    if not isinstance(got, Tensor):
        raise ExerciseFailed(f"{case}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(expected.shape):
        raise ExerciseFailed(f"{case}: wrong shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}")
    got_f, exp_f = got.detach().double(), expected.detach().double()
    bad = ~torch.isfinite(got_f) & torch.isfinite(exp_f)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ExerciseFailed(f"{case}: {int(bad.sum())} NaN/inf values where the reference is finite, first at "
                             f"index {idx} (reference {exp_f[idx].item():.4g})")
    # Where the reference is an infinity (a filtered logit, a masked score: -inf) the answer must be
    # that same infinity. The tolerance below cannot judge these entries, and skipping them accepted
    # an answer that filtered nothing at all.
    off = torch.isinf(exp_f) & (got_f != exp_f)
    if off.any():
        idx = tuple(int(i) for i in off.nonzero()[0])
        raise ExerciseFailed(f"{case}: {int(off.sum())} entries should be {exp_f[idx].item()} (as in the reference: "
                             f"a filtered or masked entry) but are not, first at index {idx} (got "
                             f"{got_f[idx].item():.4g})")
    if zero_where is not None:
        leak = zero_where & (got_f.abs() > atol)
        if leak.any():
            idx = tuple(int(i) for i in leak.nonzero()[0])
            raise ExerciseFailed(f"{case}: {int(leak.sum())} {zero_what} are non-zero, first at index {idx} "
                                 f"(value {got_f[idx].item():.4g}, expected 0)")
    diff = (got_f - exp_f).abs()
    diff = torch.where(torch.isfinite(exp_f), diff, torch.zeros_like(diff))
    tol = atol + rtol * exp_f.abs().nan_to_num(0.0)
    over = diff > tol
    if over.any():
        flat = int((diff - tol).flatten().argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
        worst = diff[idx].item()
        raise ExerciseFailed(f"{case}: values differ from the reference at {int(over.sum())} of {diff.numel()} "
                             f"entries; largest difference {worst:.3g} at index {idx} (expected "
                             f"{exp_f[idx].item():.4g}, got {got_f[idx].item():.4g})")


def diagnose(case: str, got, expected: Tensor, mistakes: dict[str, Tensor], **kwargs) -> None:
    """``compare``; on a mismatch, also say which known mistake ``got`` reproduces, if any.

    ``mistakes`` maps a description ("the softmax over the wrong axis") to the result that mistake
    gives on the same inputs. Infinities must sit in the same places; NaNs count as equal."""
    try:
        compare(case, got, expected, **kwargs)
    except ExerciseFailed as failure:
        if isinstance(got, Tensor) and tuple(got.shape) == tuple(expected.shape):
            g = got.detach().double()
            for hint, wrong in mistakes.items():
                w = wrong.detach().double()
                if w.shape == g.shape and torch.equal(torch.isinf(g), torch.isinf(w)) and torch.allclose(
                        g.nan_to_num(0, 0, 0), w.nan_to_num(0, 0, 0), atol=1e-6, rtol=1e-5):
                    raise ExerciseFailed(f"{failure} -- your result equals {hint}") from None
        raise


def integer_answer(case: str, got) -> int:
    """The learner's count as a Python int (a one-element tensor is accepted); anything else fails."""
    if isinstance(got, Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, numbers.Integral) and not isinstance(got, bool):  # NumPy's int64 is a right answer too
        got = int(got)
    if isinstance(got, bool) or not isinstance(got, int):
        raise ExerciseFailed(f"{case}: your function must return an int; got {type(got).__name__}")
    return got


def diagnose_integer(case: str, got: int, expected: int, mistakes: dict[str, int]) -> None:
    """Fail unless ``got == expected``, naming every known mistake (description -> the count it gives)
    that ``got`` reproduces; two mistakes can agree on some inputs, so all matches are named."""
    if got == expected:
        return
    hints = [hint for hint, wrong in mistakes.items() if wrong == got and wrong != expected]
    extra = f" -- your result equals {' or '.join(hints)}" if hints else ""
    raise ExerciseFailed(f"{case}: expected {expected:,}, got {got:,}{extra}")


def call(case: str, fn: Callable, *args, **kwargs):
    """Call the learner's function; an exception becomes an ``ExerciseFailed`` that names the case."""
    _CASE[0] = case
    try:
        return fn(*args, **kwargs)
    except TimeLimitExceeded as late:
        raise TimeLimitExceeded(f"{case}: {late}") from None
    except ExerciseFailed:
        raise
    except Exception as e:  # the learner's bug, reported with the inputs that triggered it
        raise ExerciseFailed(f"{case}: your function raised {type(e).__name__}: {e}") from e


