"""The MLA ratio, computed for each honest baseline and for the one-layer mistake."""

from __future__ import annotations

import pytest

from infer_lab.attention.memory import mla_ratio_explained


def test_mla_ratios_match_hand_checked_values():
    same_shape, seven_b_layer, mistake = mla_ratio_explained()
    # DeepSeek-V3 MLA: (512 + 64) x 2 B = 1,152 B per layer; 61 layers = 70,272 B per token.
    assert same_shape["mla_bytes_per_token"] == 70_272 and seven_b_layer["mla_bytes_per_token"] == 1_152
    # Same-shape MHA: 2 x 128 heads x 128 x 2 B = 65,536 B per layer: 56.9x, all layers or one.
    assert same_shape["ratio"] == pytest.approx(65_536 / 1_152)
    # A 7B-class MHA layer: 2 x 32 x 128 x 2 B = 16,384 B: the talk's "about 14x".
    assert seven_b_layer["ratio"] == pytest.approx(14.22, abs=0.01)
    # One MLA layer against a whole model inflates it by the layer count.
    assert mistake["ratio"] == pytest.approx(61 * 65_536 / 1_152) and not mistake["fair"]
