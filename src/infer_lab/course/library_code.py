"""The library's real code for the page: a function's or method's source, its docstring left out
(the words around it on the page say the same), as a markdown code block short enough for a slide."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any


def source_without_docstring(obj: Any) -> str:
    """``obj``'s source, dedented, with its docstring removed."""
    lines = textwrap.dedent(inspect.getsource(obj)).splitlines()
    node = ast.parse("\n".join(lines)).body[0]
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = lines[: first.lineno - 1] + lines[first.end_lineno:]
    return "\n".join(lines).rstrip()


def code_block(*objects: Any) -> str:
    """The sources of ``objects`` (docstrings left out) as one markdown ``python`` block."""
    return "```python\n" + "\n\n".join(source_without_docstring(o) for o in objects) + "\n```"
