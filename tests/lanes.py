"""Slow per-notebook tests share one run of everything selected, two lanes at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def selected(request: Any, test_name: str, param: str) -> list[Any]:
    """The values of ``param`` for the tests called ``test_name`` that this session runs."""
    return [item.callspec.params[param] for item in request.session.items
            if getattr(item, "originalname", "") == test_name]


def in_lanes(run: Callable[[Any], Any], values: Iterable[Any], name: Callable[[Any], str],
             first: Iterable[str] = (), at_once: int = 2) -> dict[str, Any]:
    """``{name(v): run(v)}``, ``at_once`` runs at a time; names in ``first`` start first, in that
    order (the longest), so the lanes finish together."""
    first = list(first)
    order = sorted(values, key=lambda v: (first.index(name(v)) if name(v) in first else len(first), name(v)))
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        return dict(zip([name(v) for v in order], pool.map(run, order), strict=True))
