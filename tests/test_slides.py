"""The deck (infer-lab slides), the opener, the foundations narrative and chapter 16's arithmetic."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from infer_lab.cli import main
from infer_lab.course import chapters
from infer_lab.course.slides.deck import clock, load_agenda

ROOT = Path(__file__).resolve().parents[1]
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


# ---------------------------------------------------------------------------------------------
# Data and arithmetic


def test_agenda_is_two_contiguous_hours_and_lists_every_chapter():
    agenda = load_agenda()
    assert agenda[0].start == 0 and agenda[-1].end == 120
    assert all(a.end == b.start for a, b in zip(agenda, agenda[1:], strict=False))
    listed = {n for a in agenda for n in a.chapters}
    assert {m.NUMBER for m in chapters()} <= listed, "a chapter is missing from data/agenda.json"
    assert [a.kind for a in agenda][0] == "opener" and agenda[-1].kind == "close"
    assert clock(75) == "1:15" and clock(0) == "0:00"


def test_token_volumes_are_cited_and_their_growth_computed():
    from infer_lab.course import opener

    volumes = opener.token_volumes()
    assert [v.as_of for v in volumes] == sorted(v.as_of for v in volumes)
    for v in volumes:
        assert v.url.startswith("https://") and v.who and v.where and DATE.fullmatch(v.reported)
    result = opener.compute()
    last = result.growth[-1]
    assert last.factor == pytest.approx(volumes[-1].value / volumes[-2].value)
    assert (1 + last.monthly_growth) ** last.months == pytest.approx(last.factor)
    assert result.overall.factor == pytest.approx(volumes[-1].value / volumes[0].value)
    for cost in result.costs:  # a month of the latest volume at the planner's $/M tokens
        assert cost.usd_per_month == pytest.approx(volumes[-1].value / 1e6 * cost.usd_per_m_tokens)
        assert cost.usd_per_m_tokens == pytest.approx(cost.usd_per_hour / (cost.tokens_per_s * 3600) * 1e6)
    costs = [b.usd_per_m_tokens for b in result.batch_costs]
    assert costs == sorted(costs, reverse=True) and costs[0] > 10 * costs[-1]  # batching shares the weights
    t = result.training
    assert t.tokens_to_match == pytest.approx(3 * t.training_tokens)  # 6ND / 2N
    assert "nan" not in opener.summary(result).lower()


def test_on_chip_memory_reproduces_the_flashattention_a100_figures():
    from infer_lab.catalog import UnknownNameError, get_gpu, get_on_chip_memory

    a100 = get_on_chip_memory("A100-40GB")
    assert a100.sram_bandwidth_Bps == 108 * 128 * 1410e6  # 19.5 TB/s: "19 TB/s" in the paper
    assert a100.sram_bytes == 108 * 192 * 1024  # 21 MB: "20 MB"
    h100 = get_on_chip_memory("H100")  # aliases resolve
    assert h100.gpu == "H100-SXM" and 5 < h100.sram_bandwidth_Bps / get_gpu("H100-SXM").bandwidth_Bps < 20
    assert get_on_chip_memory("B200") is None  # no sourced figure: missing, not invented
    with pytest.raises(UnknownNameError):
        get_on_chip_memory("no-such-gpu")


def test_foundations_numbers():
    from infer_lab.analysis.params import param_counts
    from infer_lab.course import ch03_memory_equation as ch03
    from infer_lab.course import ch04_prefill_decode_roofline as ch04

    share = ch03.flop_share("mistral-7b", 4096)
    assert share.head_flops == 2 * 32768 * 4096 and share.embedding_flops == 0
    assert share.layers_share > 0.95  # "about 95% of compute is in the layers"
    assert share.layer_params == param_counts("mistral-7b").attention + param_counts("mistral-7b").mlp_dense + \
        param_counts("mistral-7b").norms
    assert [s.stage for s in ch03.loop_stages()][:2] == ["tokenize", "embed"]
    small = ch03.flop_share("smollm2-135m", 4096)
    assert small.head_params == 0 and small.head_share > share.head_share  # tied, but its matmul still runs

    one = ch04.decode_wait("mistral-7b", "H100-SXM", 1, 4096)
    assert 0.9 < one.intensity < 1.3 and one.ridge_point > 100  # about 1 FLOP/B in bf16
    assert one.waiting_fraction > 0.99
    waits = [w.waiting_fraction for w in ch04.decode_wait_curve()]
    assert waits == sorted(waits, reverse=True)
    rows = ch04.hierarchy_rows()
    assert {r.gpu for r in rows if r.sram_bytes is None} == {"A10G", "B200", "RTX-Pro-6000-Blackwell"}
    assert "—" in ch04.hierarchy_table(rows).to_string()


def test_where_next_fetching_beats_recomputing_more_as_the_prefix_grows():
    from infer_lab.course import ch16_where_next as ch16

    t = ch16.tiers("llama-3-70b", "H100-SXM", (1024, 16384, 131072))
    ratios = [r.recompute_s / r.fetch_s["CPU memory over PCIe Gen5"] for r in t.rows]
    assert ratios == sorted(ratios) and ratios[-1] > 1
    assert t.n_gpus == ch16.serving_gpus("llama-3-70b", "H100-SXM", 131072) > 1  # 140 GB of weights
    rows = ch16.directions(ch16.sizes("cpu", "quick"))
    assert [d.key for d in rows] == ["eviction", "tiers", "disaggregation", "kernels"]
    assert all(d.tools for d in rows)
    assert any("03 ·" in c for c in rows[0].chapters)  # the references name the chapters present


# ---------------------------------------------------------------------------------------------
# The deck


class _Page(HTMLParser):
    """Visible text, figures (img + caption), section bars and external references of the deck."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.images: list[str] = []
        self.captions: list[str] = []
        self.external: list[str] = []
        self._skip = 0
        self._caption = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag == "figcaption":
            self._caption = True
            self.captions.append("")
        for key in ("src", "href"):
            value = a.get(key) or ""
            if value.startswith(("http:", "https:", "//")) and not (tag == "a" and key == "href"):
                self.external.append(value)
        if tag == "link":
            self.external.append(a.get("href", ""))

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        if tag == "figcaption":
            self._caption = False

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        if self._caption:
            self.captions[-1] += data


def _build(tmp_path, *flags):
    out = tmp_path / "deck"
    rc = main(["slides", "--out", str(out), *flags])
    html = (out / "index.html").read_text(encoding="utf-8")
    page = _Page()
    page.feed(html)
    return rc, html, page


def _check_deck(rc, html, page, only=None):
    from infer_lab.hardware import device_label

    assert rc == 0, "a chapter failed while building the deck (see its 'could not run here' slide)"
    present = {m.NUMBER for m in chapters(only)}
    for entry in load_agenda():
        if entry.kind != "chapters" or present & set(entry.chapters):
            assert f"{clock(entry.start)}–{clock(entry.end)} · {entry.title}" in html, entry.key
    for mod in chapters(only):
        assert mod.TITLE in html
    words = " ".join(page.text).split()
    for raw in ("nan", "NaN", "None"):
        assert raw not in words, f"the deck shows {raw!r}"
    assert page.images and all(src.startswith("data:image/png;base64,") for src in page.images)
    assert len(page.captions) == len(page.images)
    for caption in page.captions:  # every figure says where and when it came from
        assert DATE.search(caption), caption
        assert re.match(r"(Measured on|Analytic|Saved result|Catalog data|Cited)", caption), caption
        if caption.startswith("Measured on"):
            assert device_label() in caption
    assert not page.external, page.external
    assert html.count('class="slide ') == html.count('class="notes"')  # speaker notes on every slide
    assert "Speaker notes" in html and "window.deck" in html


def test_deck_builds_saved_only_with_every_section(tmp_path):
    rc, html, page = _build(tmp_path, "--saved-only")
    _check_deck(rc, html, page)
    assert "Why inference cost matters" in html and "Token volumes exploded" in html
    assert "Saved result, not measured on this machine" in html  # the saved GPU views
    assert "Measured on" not in " ".join(page.captions)  # nothing was measured
    # every chapter keeps its analytic and simulated parts (issue #23): chapter 15's wafer point and chapter 14's fast mode
    for mod in chapters():
        assert f"{mod.TITLE.split(':')[0]}: what we found" in html, mod.NUMBER
    assert "Cerebras" in html and "Fast mode" in html and "Coding agents" in html


# Measuring every chapter again here would repeat test_chapters (about 3 CI minutes); two chapters
# that measure with the model show that measured figures reach the deck with their provenance.
MEASURED_IN_DECK = ["ch04", "ch08"]


@pytest.mark.slow
def test_deck_builds_at_quick_sizes(tmp_path):
    rc, html, page = _build(tmp_path, "--quick", "--only", *MEASURED_IN_DECK)
    _check_deck(rc, html, page, MEASURED_IN_DECK)
    assert any(c.startswith("Measured on") for c in page.captions)
    others = [m.TITLE for m in chapters() if m not in chapters(MEASURED_IN_DECK)]
    assert others and not any(title in html for title in others)  # --only keeps just those


def _screenshot_tool():
    spec = importlib.util.spec_from_file_location("screenshot_notebooks", ROOT / "scripts" / "screenshot_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_deck_navigates_in_chromium(tmp_path):
    tool = _screenshot_tool()
    missing = tool.browser_missing()
    if missing and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the browser check, but {missing}")
    if missing:
        pytest.skip(missing)
    rc, _, _ = _build(tmp_path, "--saved-only", "--only", "ch03", "ch16")
    assert rc == 0
    with tool.chromium() as context:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: errors.append(r.url) if not r.url.startswith(("file:", "data:", "about:")) else None)
        page.goto((tmp_path / "deck" / "index.html").as_uri())
        count = page.evaluate("window.deck.count")
        assert page.locator(".slide.active h1").inner_text().startswith("LLM inference")
        page.keyboard.press("ArrowRight")
        assert page.evaluate("window.deck.index()") == 1 and page.url.endswith("#2")
        page.keyboard.press("End")
        assert page.evaluate("window.deck.index()") == count - 1
        page.keyboard.press("n")
        assert page.locator(".slide.active .notes").is_visible()
        page.keyboard.press("o")
        assert page.locator("#overview").is_visible()
        page.locator('#overview [data-go="3"]').click()
        assert page.evaluate("window.deck.index()") == 2 and not page.locator("#overview").is_visible()
        with page.expect_popup() as popup:
            page.keyboard.press("s")
        speaker = popup.value
        assert page.locator(".slide.active h1").inner_text() in speaker.locator("#speaker").inner_text()
        speaker.keyboard.press("ArrowRight")  # keys in the speaker view drive the deck
        assert page.evaluate("window.deck.index()") == 3
        assert not errors, errors
    assert math.isfinite(count) and count > 10
