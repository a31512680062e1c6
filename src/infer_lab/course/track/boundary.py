"""The learner's function boundary: every call into a learner's component goes through here.

A learner's component runs deep inside the engine: a scheduler called by a step loop called by a
server thread. When it raises, the bare error (an ``IndexError`` in a ``deque``) names none of
the learner's functions. Here each call into the learner's code is wrapped: an exception becomes
a :class:`LearnerCodeError` whose message names the learner's function, the inputs it was called
with (shapes, dtypes, values) and the line of the learner's file that raised, with a hint only
when one matches the mistake.

Results are also taken as the engine needs them: a block count of ``2.0`` becomes ``2``, a
float64 attention output becomes the query's dtype, a token that is a 0-d tensor becomes an
``int``. A result that cannot be taken (``2.5`` blocks, a negative count, a tensor of the wrong
shape) is refused with a message that names the function and what it returned.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import math
import numbers
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...engine.scheduler import SchedulerOutput
from ...engine.sequence import Sequence

Adapter = Callable[[Any, tuple, dict], Any]  # (result, args, kwargs) -> the result the engine takes


class LearnerCodeError(RuntimeError):
    """A learner's function raised or returned something the engine cannot take; the message says where."""

    def __init__(self, message: str, function: str = "", line: int | None = None):
        super().__init__(message)
        self.function, self.line = function, line


class BadResult(ValueError):
    """Raised by an adapter: the learner's result cannot be taken (the message says why)."""


# ---------------------------------------------------------------------------------------------
# Describing values for people


def describe(value: Any, limit: int = 60) -> str:
    """A short description of an argument or result: shapes and dtypes for tensors, values otherwise."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return f"tensor({value.item()!r}, {str(value.dtype).replace('torch.', '')})"
        return f"tensor{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, Sequence):
        return (f"Sequence({value.request_id}: {len(value.prompt_ids)} prompt + {len(value.output_ids)} output "
                f"tokens, num_computed={value.num_computed}, block_table={_short(value.block_table, 40)})")
    if isinstance(value, SchedulerOutput):
        return (f"SchedulerOutput({len(value.scheduled)} scheduled: "
                + ", ".join(f"{s.seq.request_id} {s.num_new_tokens} tokens from {s.start}" for s in value.scheduled[:4])
                + (" ..." if len(value.scheduled) > 4 else "") + ")")
    if isinstance(value, (int, float, str, bool, type(None))):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return _short(value, limit)
    if callable(value):
        return getattr(value, "__name__", type(value).__name__)
    return type(value).__name__


def _short(value: Any, limit: int) -> str:
    text = repr(value)
    if len(text) <= limit:
        return text
    return text[: limit - 4] + " ..." + (f" ({len(value)} items)" if hasattr(value, "__len__") else "")


def _call_text(name: str, args: tuple, kwargs: dict, params: list[str]) -> str:
    parts = []
    for i, a in enumerate(args):
        label = params[i] if i < len(params) else ""
        parts.append(f"{label}={describe(a)}" if label else describe(a))
    parts += [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _learner_frame(exc: BaseException, path: Path) -> tuple[int, str] | None:
    """The last line of the learner's file in ``exc``'s traceback, and its source."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path:
            found = (frame.lineno, (frame.line or linecache.getline(frame.filename, frame.lineno)).strip())
    return found


# Hints, each given only when its pattern matches the error and the function is one it was written for:
# (exception type name, text in the message, words of the function's label (any: ()), hint).
HINTS = (
    ("OutOfKVMemory", "", (), "the KV cache ran out of blocks: ask kv.can_allocate(seq, n) before kv.allocate(seq, "
                              "n), and let the request wait (or preempt the newest) when it says no"),
    ("RuntimeError", "expected scalar type", (), "the engine computes in the model's dtype (float32 here): convert "
                                                 "with .to(x.dtype) before mixing tensors"),
    ("RuntimeError", "same dtype", (), "the engine computes in the model's dtype (float32 here): convert with "
                                       ".to(x.dtype) before mixing tensors"),
    ("RuntimeError", "must match the size", ("forward", "attention", "PagedKVStore"),
     "two tensors' shapes disagree: print their .shape; q is (tokens, heads, head_dim) and k, v are (tokens, "
     "kv_heads, head_dim)"),
    ("IndexError", "deque", ("BlockManager",), "a pop from an empty free list: check that enough blocks are free "
                                               "before taking any"),
    ("ZeroDivisionError", "", (), "a division by zero: which count can be 0 here (an empty list, a block size)?"),
)


def _hint(exc: BaseException, label: str) -> str:
    name, text = type(exc).__name__, str(exc)
    for exc_name, pattern, where, hint in HINTS:
        if name == exc_name and pattern in text and (not where or any(w in label for w in where)):
            return hint
    return ""


# ---------------------------------------------------------------------------------------------
# Wrapping


def guard_function(fn: Callable[..., Any], label: str, path: Path, adapt: Adapter | None = None,
                   params: list[str] | None = None) -> Callable[..., Any]:
    """``fn`` called through the boundary: errors name ``label`` (``"your BlockManager.grow"``), its
    inputs and the line of ``path``; ``adapt`` takes (and may convert or refuse) the result."""
    path = Path(path).resolve()
    if params is None:
        try:
            params = [p for p in inspect.signature(fn).parameters if p != "self"]
        except (TypeError, ValueError):
            params = []

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except LearnerCodeError:
            raise  # raised further in: it already names the innermost of the learner's functions
        except NotImplementedError as exc:
            raise LearnerCodeError(f"{label}() is not written yet (it still raises NotImplementedError)",
                                   label) from exc
        except Exception as exc:
            where = _learner_frame(exc, path)
            message = f"{label} raised {type(exc).__name__}: {exc}\n    called as {_call_text(label, args, kwargs, params)}"
            if where:
                message += f"\n    at {path.name}:{where[0]}: {where[1]}"
            hint = _hint(exc, label)
            if hint:
                message += f"\n    hint: {hint}"
            raise LearnerCodeError(message, label, where[0] if where else None) from exc
        if adapt is None:
            return result
        try:
            return adapt(result, args, kwargs)
        except BadResult as exc:
            raise LearnerCodeError(f"{label} returned {describe(result)}: {exc}\n    called as "
                                   f"{_call_text(label, args, kwargs, params)}", label) from None
        except LearnerCodeError:
            raise
        except Exception as exc:  # a returned generator runs the learner's code while it is read
            where = _learner_frame(exc, path)
            message = (f"{label} returned a generator that raised {type(exc).__name__}: {exc}\n    called as "
                       f"{_call_text(label, args, kwargs, params)}")
            if where:
                message += f"\n    at {path.name}:{where[0]}: {where[1]}"
            raise LearnerCodeError(message, label, where[0] if where else None) from exc

    guarded.__learner__ = fn  # type: ignore[attr-defined]
    return guarded


class GuardedObject:
    """An instance of a learner's class whose public methods are called through the boundary.

    Attributes that are not methods (``stats``, ``running``...) are passed through unchanged.
    """

    def __init__(self, obj: Any, label: str, path: Path, adapters: dict[str, Adapter] | None = None):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_path", Path(path))
        object.__setattr__(self, "_adapters", adapters or {})
        object.__setattr__(self, "_cache", {})

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._obj, name)
        if name.startswith("_") or not callable(value) or isinstance(value, type):
            return value
        cached = self._cache.get(name)
        if cached is None or cached[0] != value:  # bound methods are equal for the same function and object
            cached = (value, guard_function(value, f"your {self._label}.{name}", self._path,
                                            self._adapters.get(name)))
            self._cache[name] = cached
        return cached[1]

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._obj, name, value)

    @property
    def learner_object(self) -> Any:
        return self._obj


def guard_class(cls: type, label: str, path: Path, adapters: dict[str, Adapter] | None = None
                ) -> Callable[..., GuardedObject]:
    """A factory: ``cls(*args)`` built through the boundary, its instance guarded (:class:`GuardedObject`)."""
    build = guard_function(cls, f"your {label}(...) constructor", path)

    def make(*args: Any, **kwargs: Any) -> GuardedObject:
        return GuardedObject(build(*args, **kwargs), label, path, adapters)

    make.__name__ = f"guarded_{label}"
    make.__learner__ = cls  # type: ignore[attr-defined]
    return make


# ---------------------------------------------------------------------------------------------
# Adapters: results as the engine needs them


def as_count(result: Any, args: tuple, kwargs: dict) -> int:
    """A count (blocks, tokens): an ``int``, or a float / numpy / 0-d tensor holding a whole number, >= 0."""
    value = _whole(result)
    if value < 0:
        raise BadResult("a count cannot be negative")
    return value


def as_int(result: Any, args: tuple, kwargs: dict) -> int:
    return _whole(result)


def _whole(result: Any) -> int:
    if isinstance(result, bool):
        raise BadResult("expected a whole number, got a bool")
    if isinstance(result, torch.Tensor):
        if result.numel() != 1:
            raise BadResult(f"expected one number, got a tensor of shape {tuple(result.shape)}")
        result = result.item()
    if hasattr(result, "item") and not isinstance(result, numbers.Number):
        result = result.item()
    if isinstance(result, numbers.Integral):
        return int(result)
    if isinstance(result, numbers.Real) and math.isfinite(float(result)) and float(result).is_integer():
        return int(result)
    raise BadResult("expected a whole number (an int)")


def as_bool(result: Any, args: tuple, kwargs: dict) -> bool:
    if isinstance(result, torch.Tensor):
        result = result.item()
    return bool(result)


def as_int_list(result: Any, args: tuple, kwargs: dict) -> list[int]:
    """A list of whole numbers from a list, tuple, range, generator, numpy array or tensor."""
    if isinstance(result, torch.Tensor):
        result = result.tolist()
    elif hasattr(result, "tolist"):
        result = result.tolist()
    try:
        return [_whole(x) for x in result]
    except TypeError:
        raise BadResult("expected a list of whole numbers") from None


def as_tensor_like(ref_arg: int, shape_of: Callable[[tuple], tuple] | None = None) -> Adapter:
    """A tensor in the dtype (and device) of the ``ref_arg``-th argument, with the shape ``shape_of(args)``."""

    def adapt(result: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        ref = args[ref_arg]
        if not isinstance(result, torch.Tensor):
            raise BadResult(f"expected a tensor like the argument {describe(ref)}")
        want = tuple(shape_of(args)) if shape_of is not None else tuple(ref.shape)
        if tuple(result.shape) != want:
            raise BadResult(f"expected shape {want}, got {tuple(result.shape)}")
        return result.to(dtype=ref.dtype, device=ref.device)

    return adapt


def as_token_list_and_count(result: Any, args: tuple, kwargs: dict) -> tuple[list[int], int]:
    """``(tokens, kept)``: the tokens to append and how many guesses were kept."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise BadResult("expected a pair (tokens to append, guesses kept)")
    tokens, kept = as_int_list(result[0], args, kwargs), as_count(result[1], args, kwargs)
    if not tokens:
        raise BadResult("a verification always appends at least one token (the target's own)")
    return tokens, kept  # how many tokens for ``kept`` guesses is stage 6's check to say (with its hints)
