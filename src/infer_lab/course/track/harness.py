"""What every stage's check shares: the two models, hidden traces, references, engine runs, verdicts.

* **Two models.** The embedded SmolLM2-135M (real weights; transformers' greedy output is the
  reference) and a *hidden* model: random weights of another shape (6 query heads over 2 KV heads
  of 16 dims, a q/k/v bias, 3 layers, an untied LM head, its own RoPE base and EOS id), scaled so
  that its greedy choices are far from ties, depend on the whole context and sometimes end at EOS
  (:func:`hidden_model_stats` measures that). An answer that hard-codes the embedded model's sizes,
  or drops the bias, fails on it.
* **Hidden traces.** Requests drawn from a seed the learner does not choose: prompt lengths,
  output lengths, arrival steps, shared prefixes, odd block sizes, pools small enough to force
  preemption. A failing check prints its seed, so the failure can be replayed
  (``--seed``).
* **References.** transformers' greedy ``generate`` for every prompt, with the margin between
  the best and the second-best logit at each step. Tokens must be identical; where the reference
  itself was a near tie (margin under :data:`TIE_MARGIN`), the two may part there, and the
  comparison stops at that token (it says so).
* **Engine runs.** :func:`run` builds the real :class:`~infer_lab.engine.Engine` with the given
  components, feeds a trace (arrivals by step, cancellations), steps it to the end with a step
  limit (a stuck engine is reported, not waited for), and keeps what the checks need: tokens,
  errors, per-step sizes, the pool at the end.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

from ...engine import Engine, EngineConfig, EngineParts, SamplingParams
from ...engine.model import fuse_projections
from ...models import LoadedModel, build_random_model, load_model
from ..exercises.checking import Report

TIE_MARGIN = 1e-3  # logits: a reference step whose best two logits are closer than this is a near tie
STALL_STEPS = 12  # steps in a row that compute nothing and emit nothing: the engine is stuck
HIDDEN_CONFIG = {  # the hidden model: a Qwen2-family shape (q/k/v bias) unlike the embedded model's
    "model_type": "qwen2", "vocab_size": 384, "hidden_size": 96, "intermediate_size": 160,
    "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 512,
    "rope_theta": 5000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "eos_token_id": 3,
    "bos_token_id": 1, "use_sliding_window": False,
    # Weights of std 0.3 (not transformers' 0.02): the layers, not the embedding, decide the next token,
    # so the output depends on the whole context (with 0.02 greedy decoding fell into a fixed point).
    "initializer_range": 0.3,
}
HIDDEN_HEAD_SCALE = 2.0  # the LM head, scaled: ties under TIE_MARGIN are about 3 steps in 10,000
HIDDEN_EOS_BOOST = 1.4  # the EOS row of the LM head, scaled: about 1 in 5 greedy answers of 24 tokens ends at EOS
HIDDEN_BIAS_STD = 0.5  # q/k/v biases as large as the weights: an answer that drops them changes the tokens


@dataclass(frozen=True)
class CheckModel:
    """A model the checks run: the transformers model (the reference) and its name."""

    name: str
    lm: Any  # infer_lab.models.LoadedModel

    @property
    def vocab(self) -> int:
        return int(self.lm.config.vocab_size)

    @property
    def eos(self) -> int | None:
        eos = self.lm.config.eos_token_id
        return eos if isinstance(eos, int) else None


@lru_cache(maxsize=1)
def embedded() -> CheckModel:
    """The embedded SmolLM2-135M-Instruct (fp32, CPU), loaded once per process."""
    return CheckModel("smollm2-135m", load_model("smollm2-135m", device="cpu"))


@lru_cache(maxsize=1)
def hidden() -> CheckModel:
    """The hidden model: random weights of a shape the learner never sees in the course (see the module)."""
    model = build_random_model(dict(HIDDEN_CONFIG), torch.device("cpu"), torch.float32, seed=1234)
    with torch.no_grad():
        model.lm_head.weight.mul_(HIDDEN_HEAD_SCALE)
        model.lm_head.weight[HIDDEN_CONFIG["eos_token_id"]].mul_(HIDDEN_EOS_BOOST)
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, HIDDEN_BIAS_STD)
    model.generation_config.eos_token_id = HIDDEN_CONFIG["eos_token_id"]
    fuse_projections(model)
    lm = LoadedModel(model=model, tokenizer=None, name="hidden", source="random", device=torch.device("cpu"),
                     dtype=torch.float32)
    return CheckModel("the hidden model (random weights, 6 heads over 2 KV heads of 16, q/k/v bias)", lm)


# ---------------------------------------------------------------------------------------------
# References


@dataclass(frozen=True)
class Reference:
    """transformers' greedy tokens for one prompt, and each step's best-minus-second logit."""

    tokens: tuple[int, ...]
    margins: tuple[float, ...]


@lru_cache(maxsize=512)
def _reference(model_name: str, prompt: tuple[int, ...], max_tokens: int, ignore_eos: bool) -> Reference:
    model = embedded() if model_name == "smollm2-135m" else hidden()
    hf = model.lm.model
    eos = None if ignore_eos else model.eos
    ids = torch.tensor([prompt])
    with torch.inference_mode():  # an explicit mask: without one, generate masks every token equal to the pad id
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                          output_scores=True, return_dict_in_generate=True, eos_token_id=eos,
                          pad_token_id=eos if eos is not None else 0, min_new_tokens=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    margins = []
    for scores in out.scores[: len(tokens)]:
        top = torch.topk(scores[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    if eos is not None and eos in tokens:  # generate pads after EOS: keep up to and with it
        tokens = tokens[: tokens.index(eos) + 1]
    return Reference(tuple(tokens), tuple(margins[: len(tokens)]))


def reference(model: CheckModel, prompt: Sequence[int], params: SamplingParams) -> Reference:
    """transformers' greedy continuation of ``prompt`` under ``params`` (max_tokens, ignore_eos)."""
    key = "smollm2-135m" if model.lm.source == "embedded" else "hidden"
    return _reference(key, tuple(int(t) for t in prompt), params.max_tokens, params.ignore_eos)


# ---------------------------------------------------------------------------------------------
# Hidden traces


@dataclass
class Trace:
    """Requests to feed an engine: prompts, their sampling settings, arrival steps, cancellations."""

    name: str
    prompts: list[list[int]]
    params: list[SamplingParams]
    arrivals: list[int] = field(default_factory=list)  # step at which each request arrives (0: at once)
    cancel_at: dict[int, int] = field(default_factory=dict)  # request index -> step at which it is cancelled

    def __post_init__(self) -> None:
        if not self.arrivals:
            self.arrivals = [0] * len(self.prompts)

    def describe(self) -> str:
        lens = [len(p) for p in self.prompts]
        outs = [p.max_tokens for p in self.params]
        spread = f", arriving over {max(self.arrivals) + 1} steps" if max(self.arrivals) else ""
        cancels = f", {len(self.cancel_at)} cancelled midway" if self.cancel_at else ""
        return (f"{self.name}: {len(lens)} requests, prompts of {min(lens)}-{max(lens)} tokens, "
                f"{min(outs)}-{max(outs)} new tokens{spread}{cancels}")


def random_prompt(rng: random.Random, vocab: int, length: int, low: int = 4) -> list[int]:
    """``length`` token ids in ``[low, vocab)`` (the low ids are special: BOS, EOS...)."""
    return [rng.randrange(low, vocab) for _ in range(length)]


def random_trace(seed: int, vocab: int, n: int, prompt_lens: tuple[int, int], new_tokens: tuple[int, int],
                 arrival_steps: int = 0, shared_prefix: int = 0, name: str = "a hidden trace",
                 ignore_eos: bool = True, stop_token_ids: tuple[int, ...] = ()) -> Trace:
    """``n`` random greedy requests: prompt lengths and new tokens uniform in the given ranges
    (inclusive), arrivals uniform over ``arrival_steps`` steps, the first ``shared_prefix`` tokens
    common to every prompt (a system prompt)."""
    rng = random.Random(seed)
    prefix = random_prompt(rng, vocab, shared_prefix)
    prompts, params = [], []
    for _ in range(n):
        length = rng.randint(*prompt_lens)
        prompts.append(prefix + random_prompt(rng, vocab, max(1, length - shared_prefix)))
        params.append(SamplingParams(max_tokens=rng.randint(*new_tokens), ignore_eos=ignore_eos,
                                     stop_token_ids=stop_token_ids))
    arrivals = [rng.randint(0, arrival_steps) for _ in range(n)] if arrival_steps else [0] * n
    return Trace(name, prompts, params, arrivals)


def chat_trace(questions: Sequence[str], max_tokens: int = 8, name: str = "chat prompts") -> Trace:
    """The embedded model's chat-formatted ``questions``, greedy, stopping at EOS."""
    lm = embedded().lm
    prompts = [lm.chat_ids(q)[0].tolist() for q in questions]
    return Trace(name, prompts, [SamplingParams(max_tokens=max_tokens) for _ in prompts])


# ---------------------------------------------------------------------------------------------
# Engine runs


def engine_config(**overrides: Any) -> EngineConfig:
    """The checks' engine: paged KV, plain weights (no GEMM timing), no fixed-shape decode, CPU."""
    base = dict(kv_mode="paged", block_size=5, max_model_len=128, max_num_seqs=4, static_decode=False,
                prepack_weights=False)
    base.update(overrides)
    return EngineConfig(**base)


@dataclass
class Run:
    """One trace through one engine."""

    model: CheckModel
    trace: Trace
    config: EngineConfig
    engine: Any
    outputs: list[list[int]]
    finish_reasons: list[str | None]
    errors: list[str | None]
    steps: int
    finished: bool
    crash: str | None = None  # an exception that escaped engine.step()
    step_tokens: list[int] = field(default_factory=list)  # tokens scheduled in each step
    step_seqs: list[int] = field(default_factory=list)  # requests scheduled in each step
    preemptions: int = 0
    passes: int = 0  # forward passes that produced tokens, over all requests

    @property
    def failed(self) -> bool:
        return self.crash is not None or not self.finished or any(self.errors)


def run(model: CheckModel, config: EngineConfig, parts: EngineParts | None, trace: Trace,
        max_steps: int | None = None, on_step: Callable[[Any, int], None] | None = None) -> Run:
    """Feed ``trace`` to an engine of ``config`` and ``parts`` over ``model`` and step it to the end.

    Requests arrive at their steps and are cancelled at theirs; ``on_step(engine, step)`` is called
    after every step (for checks of invariants). Stops at ``max_steps`` (default: generous) or
    when :data:`STALL_STEPS` steps in a row change nothing.
    """
    engine = Engine.from_loaded(model.lm, config, parts=parts)
    n = len(trace.prompts)
    limit = max_steps or 4 * (sum(map(len, trace.prompts)) + sum(p.max_tokens for p in trace.params)) + 50
    ids: dict[int, str] = {}
    steps, crash, still, last = 0, None, 0, None
    step_tokens, step_seqs = [], []

    def progress() -> tuple[int, int, int]:
        seqs = list(engine.requests.values())
        return (sum(len(s.output_ids) for s in seqs), sum(s.num_computed for s in seqs),
                sum(s.is_finished for s in seqs))

    try:
        while steps < limit:
            for i in range(n):
                if i not in ids and trace.arrivals[i] <= steps:
                    ids[i] = engine.add_request(list(trace.prompts[i]), trace.params[i], request_id=f"r{i}")
            for i, at in trace.cancel_at.items():
                if at == steps and i in ids:
                    engine.cancel(ids[i])
            if len(ids) == n and not engine.has_unfinished():
                break
            logged = len(engine.step_log)
            engine.step()
            if len(engine.step_log) > logged:
                step_tokens.append(engine.step_log[-1].num_tokens)
                step_seqs.append(engine.step_log[-1].num_seqs)
            steps += 1
            if on_step is not None:
                on_step(engine, steps)
            now = progress()
            still = still + 1 if now == last else 0
            last = now
            if still >= STALL_STEPS and len(ids) == n:
                break
    except Exception as exc:  # noqa: BLE001  (anything that escapes the engine is the finding)
        crash = f"{type(exc).__name__}: {exc}"
    seqs = [engine.requests.get(ids.get(i, "")) for i in range(n)]
    finished = crash is None and len(ids) == n and not engine.has_unfinished()
    return Run(model, trace, config, engine,
               outputs=[list(s.output_ids) if s is not None else [] for s in seqs],
               finish_reasons=[s.finish_reason if s is not None else None for s in seqs],
               errors=[s.error if s is not None else None for s in seqs],
               steps=steps, finished=finished, crash=crash, step_tokens=step_tokens, step_seqs=step_seqs,
               preemptions=sum(s.num_preemptions for s in seqs if s is not None),
               passes=sum(s.num_target_passes for s in seqs if s is not None))


def count_prompt_chunks(counts: list[int]) -> Callable[[Any, int], None]:
    """An ``on_step`` for :func:`run`: adds to ``counts[0]`` every scheduled piece that continued a prompt
    (a chunk that starts inside it: chunked prefill at work, so a check can say it happened)."""

    def on_step(engine: Any, step: int) -> None:
        last = engine.scheduler.last
        for item in last.scheduled if last is not None else ():
            if 0 < item.start < len(item.seq.prompt_ids):
                counts[0] += 1

    return on_step


def tokens_text(model: CheckModel, ids: Sequence[int], limit: int = 50) -> str:
    """Token ids as text for the embedded model, as ids for the hidden one."""
    tok = model.lm.tokenizer
    if tok is None:
        text = repr(list(ids))
    else:
        text = repr(tok.decode(list(ids)))
    return text if len(text) <= limit else text[: limit - 4] + " ..."


# ---------------------------------------------------------------------------------------------
# Verdicts


def compare(r: Report, case: str, result: Run, hint: str = "") -> bool:
    """Every request finished with transformers' greedy tokens (cancelled ones: a prefix of them).

    Records one case; a failure names the request, its prompt and the first different token, or
    why the engine stopped. Counts as an engine run for the report's ``tokens_identical``.
    """
    tail = f"\n    hint: {hint}" if hint else ""
    model, trace = result.model, result.trace
    if result.crash:
        r.engine_runs.append(False)
        return r.record(case, False, f"the engine stopped at step {result.steps + 1}: {result.crash}{tail}")
    for i, error in enumerate(result.errors):
        if error:
            r.engine_runs.append(False)
            return r.record(case, False, f"request {i} failed: {error}{tail}")
    if not result.finished:
        stuck = [i for i, reason in enumerate(result.finish_reasons) if reason is None]
        i = stuck[0] if stuck else 0
        r.engine_runs.append(False)
        return r.record(case, False, f"after {result.steps} steps request {i} (prompt of {len(trace.prompts[i])} "
                                     f"tokens) still has {len(result.outputs[i])} of {trace.params[i].max_tokens} "
                                     f"tokens: the engine stopped making progress{tail}")
    ties = 0
    for i, (prompt, params, got) in enumerate(zip(trace.prompts, trace.params, result.outputs, strict=True)):
        ref = reference(model, prompt, params)
        want = list(ref.tokens)
        cancelled = result.finish_reasons[i] == "cancelled"
        j = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        if j is None:
            if len(got) == len(want) or (cancelled and len(got) < len(want)):
                continue
            j = min(len(got), len(want))
        if j < len(ref.margins) and ref.margins[j] < TIE_MARGIN:
            ties += 1  # the reference itself was a near tie here: either token is right
            continue
        what = (f"expected {want[j]} {tokens_text(model, [want[j]])}, got {got[j]} {tokens_text(model, [got[j]])}"
                if j < len(got) and j < len(want) else f"{len(got)} tokens instead of {len(want)}")
        r.engine_runs.append(False)
        return r.record(case, False, f"request {i} (prompt {tokens_text(model, prompt)}): first different token at "
                                     f"output position {j} (the {j} before it agree): {what}{tail}")
    r.engine_runs.append(True)
    n = sum(map(len, result.outputs))
    tie_text = f"; {ties} stopped at a near tie of the reference" if ties else ""
    return r.record(case, True, f"{len(result.outputs)} requests, {n} tokens identical to transformers' greedy "
                                f"output, {result.steps} engine steps{tie_text}")


def pool_full(r: Report, case: str, result: Run) -> bool:
    """After the run (and after emptying the prefix cache) every block is free again: nothing leaked."""
    engine = result.engine
    kv = engine.kv
    held = engine.blocks_in_use_by_requests()
    try:
        engine.reset_prefix_cache()
        free = kv.blocks.num_free_blocks()
        ok = held == 0 and kv.all_blocks_free()
    except Exception as exc:  # noqa: BLE001  (a learner's block manager or cache may raise here)
        return r.record(case, False, f"emptying the prefix cache after the run raised {type(exc).__name__}: {exc}")
    if ok:
        return r.record(case, True, f"all {kv.num_blocks} KV blocks back in the pool")
    return r.record(case, False, f"{kv.num_blocks - free} of {kv.num_blocks} KV blocks are not back in the pool "
                                 f"after every request finished ({held} still in request block tables): a leak")


def within_budget(r: Report, case: str, result: Run, budget: int) -> bool:
    """No step scheduled more than ``budget`` tokens (chunked prefill's token budget)."""
    if not result.step_tokens:
        return r.record(case, False, "no step ran, so the budget was never tested")
    over = [(i, n) for i, n in enumerate(result.step_tokens) if n > budget]
    if over:
        return r.record(case, False, f"step {over[0][0]} scheduled {over[0][1]} tokens, over the budget of {budget}")
    return r.record(case, True, f"{len(result.step_tokens)} steps, the largest {max(result.step_tokens)} tokens "
                                f"(budget {budget})")


def hidden_model_stats(prompts: int = 128, prompt_len: int = 12, new_tokens: int = 24) -> dict[str, float]:
    """What makes the hidden model a good test, measured (tests/test_track.py asserts it).

    ``distinct``: different tokens in all greedy answers; ``context``: the share of answers whose first
    8 tokens change when the prompt's first token changes; ``near_ties``: the share of steps whose
    best two logits are closer than :data:`TIE_MARGIN`; ``eos``: the share of answers that end at EOS.
    """
    model = hidden().lm.model
    rng = random.Random(1)
    ids = torch.tensor([random_prompt(rng, HIDDEN_CONFIG["vocab_size"], prompt_len) for _ in range(prompts)])
    other = ids.clone()
    other[:, 0] = (other[:, 0] + 17) % (HIDDEN_CONFIG["vocab_size"] - 4) + 4
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        moved = model.generate(other, attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None,
                               pad_token_id=0)
    answers = out.sequences[:, prompt_len:]
    top = torch.stack([torch.topk(s.float(), 2).values for s in out.scores])
    return {"distinct": float(len(set(answers.flatten().tolist()))),
            "context": float((moved[:, prompt_len:] != answers[:, :8]).any(1).float().mean()),
            "near_ties": float(((top[..., 0] - top[..., 1]) < TIE_MARGIN).float().mean()),
            "eos": float((answers == HIDDEN_CONFIG["eos_token_id"]).any(1).float().mean())}
