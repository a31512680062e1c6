"""The MLA ratio, computed for each honest baseline and for the one-layer mistake."""

from __future__ import annotations

import pytest

from infer_lab.attention.kv_sizing import mla_ratio_explained


def test_mla_ratios_match_hand_checked_values():
    rows = mla_ratio_explained()
    same_shape, real_k, seven_b_layer, mistake = (
        rows[k] for k in ("same_shape_k128", "same_shape_k192", "7b_layer", "one_layer_mistake")
    )
    # DeepSeek-V3 MLA: (512 + 64) x 2 B = 1,152 B per layer; 61 layers = 70,272 B per token.
    assert same_shape.mla_bytes_per_token == 70_272 and seven_b_layer.mla_bytes_per_token == 1_152
    # Same-shape MHA, K and V at head dim 128: 2 x 128 heads x 128 x 2 B = 65,536 B per layer: 56.9x.
    assert same_shape.ratio == pytest.approx(65_536 / 1_152)
    assert same_shape.ratio == pytest.approx(56.89, abs=0.01)
    # DeepSeek's real K head is 192 (128 + 64 RoPE), V 128: 128 x (192 + 128) x 2 B = 81,920 B: 71.1x.
    assert (real_k.k_head_dim, real_k.v_head_dim) == (192, 128)
    assert real_k.mha_bytes_per_token == 61 * 81_920
    assert real_k.ratio == pytest.approx(81_920 / 1_152) == pytest.approx(71.11, abs=0.01)
    # A 7B-class MHA layer: 2 x 32 x 128 x 2 B = 16,384 B: the talk's "about 14x".
    assert seven_b_layer.ratio == pytest.approx(14.22, abs=0.01)
    # One MLA layer against a whole model inflates it by the layer count.
    assert mistake.ratio == pytest.approx(61 * 65_536 / 1_152) and not mistake.fair
    assert all(r.fair for r in (same_shape, real_k, seven_b_layer))
