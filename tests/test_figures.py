"""Log axes are labelled in plain numbers, so no course figure depends on matplotlib's mathtext."""

from __future__ import annotations

import io

import matplotlib
import matplotlib.pyplot as plt
import pytest

from infer_lab.figures import finish, log_tick_label


@pytest.mark.parametrize("value, label", [
    (0.01, "0.01"), (0.5, "0.5"), (1, "1"), (512, "512"), (1000, "1k"), (1024, "1k"), (32768, "32k"),
    (131072, "128k"), (2**20, "1M"), (1e5, "100k"), (3e6, "3M"), (2.5e9, "2.5G"), (300, "300")])
def test_log_ticks_read_as_people_write_them(value, label):
    assert log_tick_label(value) == label


def test_a_log_figure_draws_without_the_mathtext_parser(monkeypatch):
    """JupyterLab's kernels can break mathtext's parser on first use (ParseException): our log
    figures must not need it. Here the parser always fails, and the course figure still draws."""
    import matplotlib._mathtext as mathtext

    from infer_lab.course import ch16_where_next as ch16

    def broken(*args, **kwargs):
        raise ValueError("ParseException: the mathtext parser was called")

    monkeypatch.setattr(mathtext.Parser, "parse", broken)
    matplotlib.mathtext.MathTextParser._parse_cached.cache_clear()
    s = ch16.sizes("cpu", "quick")
    fig = ch16.tiers_figure(ch16.tiers(s.model, s.gpu, s.contexts))
    fig.savefig(io.BytesIO(), format="png")
    labels = [t.get_text() for t in fig.axes[0].xaxis.get_ticklabels()]
    plt.close(fig)
    assert "1k" in labels or "4k" in labels, labels

    fig, ax = plt.subplots()  # matplotlib's own log labels do need it: the test can fail
    ax.set_xscale("log")
    ax.plot([1, 1000], [1, 2])
    with pytest.raises(ValueError, match="mathtext parser was called"):
        fig.savefig(io.BytesIO(), format="png")
    finish(fig)  # and the helper fixes exactly that
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)
