"""The IPython display pieces that both Jupyter front-ends share.

:mod:`infer_lab.course.jupyter` (the chapter panels, explorers) and the ipywidgets apps of
:mod:`infer_lab.course.calculator` both use them. They live here, below both, so that neither
imports the other's module back: ``jupyter`` imports ``calculator``, never the reverse.
Both imports are lazy: ipywidgets and IPython are optional (Jupyter/Colab only).
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

import markdown


def ipywidgets_module() -> Any:
    """The ``ipywidgets`` module, or an ImportError that says how to install it."""
    try:
        import ipywidgets  # optional: ipywidgets
    except ImportError as exc:
        raise ImportError(
            "the Jupyter/Colab widgets need ipywidgets: pip install ipywidgets "
            "(in marimo, use kv_controls / capacity_controls instead)"
        ) from exc
    return ipywidgets


def say(text: str) -> None:
    """Display computed markdown, whose ``$`` are dollars, not LaTeX.

    Jupyter typesets ``$2.49/h, $0.08`` as math in a Markdown output (inside a widget's output
    area too), and backslash escapes do not survive every renderer. So the text goes out as HTML
    with each ``$`` in its own element, where no math delimiter can pair it with the next one.
    """
    from IPython.display import HTML, display  # optional: IPython (Jupyter/Colab only)

    body = markdown.markdown(textwrap.dedent(text).strip(), extensions=["tables", "sane_lists"])
    display(HTML(body.replace("$", "<span>$</span>")))


def show_figure(fig: Any) -> None:
    """Display a matplotlib figure as a PNG (whatever the backend).

    Course figures are built without pyplot (:func:`infer_lab.figures.subplots`), so no other
    thread of the kernel (a subshell's post-run hook closing every pyplot figure) can touch one
    while it is saved here; a pyplot figure passed in is closed afterwards, as before.
    """
    from IPython.display import Image, display  # optional: IPython (Jupyter/Colab only)

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    if getattr(fig.canvas, "manager", None) is not None:  # a pyplot figure: release it
        import matplotlib.pyplot as plt  # defers matplotlib.pyplot

        plt.close(fig)
    display(Image(data=buf.getvalue()))
