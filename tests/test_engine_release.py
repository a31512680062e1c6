"""A long-running engine keeps nothing per finished request once released, and a bounded step log."""

from __future__ import annotations

import pytest

from infer_lab.engine import Engine, EngineConfig, SamplingParams
from infer_lab.engine.model import EngineModel


@pytest.fixture(scope="module")
def model(embedded) -> EngineModel:
    return EngineModel.from_hf(embedded.model)


def test_released_requests_leave_nothing_behind(model, embedded):
    engine = Engine(model, EngineConfig(max_num_seqs=4, max_model_len=64, step_log_limit=5))
    ids = embedded.random_ids(1, 6)[0].tolist()
    finished = []
    for i in range(12):
        engine.add_request(ids, SamplingParams(max_tokens=3, ignore_eos=True), request_id=f"r{i}",
                           on_token=lambda ev: finished.append(ev.request_id) if ev.finished else None)
    while engine.has_unfinished():
        engine.step()
    outputs = [engine.release(rid) for rid in finished]
    assert len(outputs) == 12 and all(len(o.token_ids) == 3 for o in outputs)
    assert engine.requests == {}
    assert engine.kv.pool.num_used == 0
    assert len(engine.step_log) == 5  # bounded: only the most recent steps are kept


def test_release_refuses_a_running_request(model, embedded):
    engine = Engine(model, EngineConfig(max_num_seqs=2, max_model_len=64))
    rid = engine.add_request(embedded.random_ids(1, 4)[0].tolist(), SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="still running"):
        engine.release(rid)
    with pytest.raises(KeyError):
        engine.release("no-such-id")
    engine.cancel(rid)
    assert engine.release(rid).finish_reason == "cancelled"
