"""Our engine beside HF, vLLM's CPU build and llama.cpp: one workload, one client, interleaved rounds.

Every contender is a server process on 127.0.0.1 speaking the OpenAI API, started once and alone
(its start is timed), and driven by the same load generator (:mod:`infer_lab.loadgen`) with the
same requests: random token-id prompts of exactly ``input_tokens``, ``output_tokens`` generated
with EOS ignored, at each concurrency. Rounds interleave the contenders (round 1: A B C D; round 2:
B C D A ...), so slow drifts of a shared machine fall on all of them; each (round, concurrency)
has its own seed, the same for every contender, so no engine's prefix cache is ever warm from an
earlier level. The table gives the median over rounds with the spread beside it.

Beside the speed:

- **agreement:** greedy answers to a few chat-free prompts, compared with transformers' own
  greedy tokens (token ids where the server returns them, vLLM's ``return_token_ids``; else text);
- **resident memory** of each server's process tree after the rounds (RSS, bytes);
- **the ledger** (:mod:`infer_lab.bench.ledger`): the bytes one decode step streams at that
  concurrency, the GB/s the measured tok/s implies, as a fraction of this machine's copy bandwidth.

``engine_vs_vllm`` is our output tok/s divided by vLLM-CPU's, per concurrency, per round and median.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import launchers, local_engines
from ..harness import env_metadata
from ..models import EMBEDDED_NAME, embedded_gguf_path, load_model
from ..parallel.reference import hf_greedy_tokens
from . import ledger
from .llama_cpp import streamed_bytes

CONTENDERS = ("ours", "hf", "vllm-cpu", "llama-cpp")
LABELS = {"ours": "our engine", "hf": "HF transformers", "vllm-cpu": "vLLM 0.32.0 (CPU build)",
          "llama-cpp": "llama.cpp (llama-cpp-python 0.3.36)"}
CHECK_PROMPTS = ("The capital of France is", "A KV cache stores",
                 "def fibonacci(n):", "The three primary colors are")


@dataclass(frozen=True)
class Workload:
    """What every contender serves: lengths in tokens, load levels, rounds."""

    input_tokens: int = 128
    output_tokens: int = 64
    concurrencies: tuple[int, ...] = (1, 4, 16)
    requests_per_user: int = 2  # requests per level = concurrency x this
    rounds: int = 2
    warmup: int = 2  # unrecorded requests before each level
    check_tokens: int = 24  # greedy tokens per agreement prompt
    max_model_len: int = 2048
    timeout_s: float = 900.0  # per request

    def requests(self, concurrency: int) -> int:
        return concurrency * self.requests_per_user


@dataclass
class Server:
    """One contender's running server."""

    contender: str
    label: str
    url: str
    pid: int
    start_s: float  # command to first healthy answer
    version: str | None
    command: list[str]
    takes_token_ids: bool = True  # False: prompts go as the text the ids decode to (llama-cpp-python's server)
    saved: bool = False  # True when read back from a saved run
    notes: dict[str, Any] = field(default_factory=dict)  # what its log said of its setup (vLLM: cores bound)


@dataclass(frozen=True)
class Level:
    """One contender at one concurrency in one round, as the load generator measured it (ms, 1/s)."""

    contender: str
    concurrency: int
    round: int
    requests: int
    failed: int
    output_tokens_per_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    tpot_ms_p50: float | None
    output_tokens: int | None
    seconds: float


@dataclass(frozen=True)
class Agreement:
    """Greedy answers compared with transformers': how many prompts match, compared how."""

    contender: str
    compared: str  # "token ids" or "text"
    matches: int
    prompts: int
    first_difference: str = ""


@dataclass
class SideBySide:
    """The whole run: one row per contender and concurrency (median over rounds) and everything behind it."""

    workload: Workload
    servers: list[Server]
    levels: list[Level]
    agreement: list[Agreement]
    memory: dict[str, int | None]  # resident bytes of each server's process tree after the rounds
    ledger: dict[str, dict[int, dict[str, Any]]]  # contender -> concurrency -> ledger_row
    skipped: dict[str, str]  # contender -> why it did not run
    machine: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what a reader of this run must know (said under its text)

    def median(self, contender: str, concurrency: int, key: str = "output_tokens_per_s") -> float | None:
        values = [getattr(lv, key) for lv in self.levels
                  if lv.contender == contender and lv.concurrency == concurrency and getattr(lv, key) is not None]
        return statistics.median(values) if values else None

    def spread(self, contender: str, concurrency: int, key: str = "output_tokens_per_s") -> tuple[float, float] | None:
        values = [getattr(lv, key) for lv in self.levels
                  if lv.contender == contender and lv.concurrency == concurrency and getattr(lv, key) is not None]
        return (min(values), max(values)) if values else None

    def engine_vs(self, other: str = "vllm-cpu") -> dict[int, dict[str, Any]]:
        """Our output tok/s over ``other``'s per concurrency: the median of the per-round ratios, and each."""
        out = {}
        for c in self.workload.concurrencies:
            rounds = []
            for r in sorted({lv.round for lv in self.levels}):
                ours = next((lv for lv in self.levels if (lv.contender, lv.concurrency, lv.round) == ("ours", c, r)), None)
                them = next((lv for lv in self.levels if (lv.contender, lv.concurrency, lv.round) == (other, c, r)), None)
                if ours and them and ours.output_tokens_per_s and them.output_tokens_per_s:
                    rounds.append(ours.output_tokens_per_s / them.output_tokens_per_s)
            if rounds:
                out[c] = {"median": statistics.median(rounds), "rounds": rounds}
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One row per contender and concurrency: medians over rounds, the spread, memory, ledger, agreement."""
        out = []
        for server in self.servers:
            name = server.contender
            agree = next((a for a in self.agreement if a.contender == name), None)
            for c in self.workload.concurrencies:
                spread = self.spread(name, c)
                out.append({
                    "contender": name, "concurrency": c,
                    "output_tokens_per_s": self.median(name, c),
                    "output_tokens_per_s_min": spread[0] if spread else None,
                    "output_tokens_per_s_max": spread[1] if spread else None,
                    **{k: self.median(name, c, k) for k in
                       ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "tpot_ms_p50")},
                    "rss_bytes": self.memory.get(name), "start_s": server.start_s, "version": server.version,
                    "agreement": f"{agree.matches}/{agree.prompts} {agree.compared}" if agree else None,
                    **{f"ledger_{k}": v for k, v in self.ledger.get(name, {}).get(c, {}).items()},
                })
        return out

    def to_json(self) -> dict[str, Any]:
        return {"kind": "engines-side-by-side", "environment": self.machine, "command": self.command,
                "seconds": self.seconds, "workload": dataclasses.asdict(self.workload),
                "servers": [dataclasses.asdict(s) for s in self.servers],
                "skipped": self.skipped, "agreement": [dataclasses.asdict(a) for a in self.agreement],
                "memory": self.memory, "ledger": {k: {str(c): v for c, v in d.items()} for k, d in self.ledger.items()},
                "rows": self.rows(), "levels": [dataclasses.asdict(lv) for lv in self.levels],
                "engine_vs_vllm": {str(c): v for c, v in self.engine_vs("vllm-cpu").items()}, "notes": self.notes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SideBySide:
        """Read back a saved run (``to_json``)."""
        workload = Workload(**{**data["workload"], "concurrencies": tuple(data["workload"]["concurrencies"])})
        return cls(workload=workload, servers=[Server(**{**s, "saved": True}) for s in data["servers"]],
                   levels=[Level(**lv) for lv in data["levels"]],
                   agreement=[Agreement(**a) for a in data["agreement"]], memory=data["memory"],
                   ledger={k: {int(c): v for c, v in d.items()} for k, d in data.get("ledger", {}).items()},
                   skipped=data.get("skipped", {}), machine=data.get("environment", {}),
                   command=data.get("command", ""), seconds=data.get("seconds", 0.0), notes=data.get("notes", []))


# ---------------------------------------------------------------------------------------------
# Servers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def why_unavailable(contender: str) -> str | None:
    """``None`` when the contender can run here, else why not (with what to do)."""
    if contender in ("ours", "hf"):
        return None
    if contender not in local_engines.SPECS:
        raise ValueError(f"unknown contender {contender!r}; use some of {', '.join(CONTENDERS)}")
    if os.environ.get(local_engines.STANDIN_ENV):
        return None
    if (reason := local_engines.why_not_installable(contender)) is not None:
        return reason
    if local_engines.installed(contender) is None:
        return f"not installed: run `infer-lab engines install {contender}` ({local_engines.SPECS[contender].install_note})"
    return None


def start(contender: str, workload: Workload, *, model: str = EMBEDDED_NAME, port: int | None = None,
          timeout_s: float = 600.0) -> Server:
    """Start one contender's server on 127.0.0.1 and wait until it answers (the start is timed)."""
    port = port or free_port()
    if contender in ("ours", "hf"):
        max_seqs = max(16, *workload.concurrencies)
        cmd = [sys.executable, "-m", "infer_lab", "serve", "--engine", contender, "--model", model,
               "--port", str(port), "--max-model-len", str(workload.max_model_len), "--served-model-name", model]
        if contender == "ours":
            cmd += ["--engine-option", f"max_num_seqs={max_seqs}"]
        log_file = launchers.state_dir() / f"{contender}-{port}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(log_file, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            launchers.wait_healthy(url, timeout_s, proc, poll_s=0.25)
        except RuntimeError as exc:
            launchers.terminate(proc.pid)
            raise RuntimeError(f"{contender} did not start: {exc}\n{launchers.log_tail(log_file)}") from exc
        ready_s = time.monotonic() - t0
        rec = launchers.LaunchRecord(contender, proc.pid, url, cmd, str(log_file), time.time(), ready_s=ready_s)
        rec.path().write_text(json.dumps(dataclasses.asdict(rec), indent=1))  # `infer-lab engines stop` finds it
        return Server(contender, LABELS[contender], url, proc.pid, ready_s,
                      launchers.engine_version("infer_lab", url), cmd)
    settings = local_engines.LaunchSettings(model=model, port=port, max_model_len=workload.max_model_len,
                                            max_num_seqs=max(16, *workload.concurrencies))
    rec = local_engines.launch(contender, settings, timeout_s=timeout_s)
    notes = local_engines.vllm_binding(rec.log_file) if contender == "vllm-cpu" else {}
    return Server(contender, LABELS[contender], rec.url, rec.pid, rec.ready_s or 0.0, rec.version, rec.command,
                  takes_token_ids=contender != "llama-cpp", notes=notes)


def stop(server: Server) -> None:
    """End the server's process group."""
    launchers.terminate(server.pid)
    for path in launchers.state_dir().glob(f"{server.contender}-{server.url.rsplit(':', 1)[-1]}.json"):
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# Agreement with transformers


def _post(url: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def greedy_answer(server: Server, model: str, prompt_ids: list[int], max_tokens: int,
                  prompt_text: str) -> tuple[list[int] | None, str]:
    """The server's greedy answer to a prompt (its token ids, or its text where the server takes no
    ids): (the answer's token ids when the server returns them, its text)."""
    body = {"model": model, "prompt": prompt_ids if server.takes_token_ids else prompt_text,
            "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    data = _post(server.url + "/v1/completions", body)
    choice = data["choices"][0]
    return choice.get("token_ids"), choice.get("text") or ""


def agreement(servers: Sequence[Server], lm: Any, max_tokens: int) -> list[Agreement]:
    """Each server's greedy answers to :data:`CHECK_PROMPTS`, compared with transformers' greedy tokens
    (EOS kept): as token ids where the server returns them, else as decoded text."""
    prompts = [lm.tokenizer(p)["input_ids"] for p in CHECK_PROMPTS]
    reference = hf_greedy_tokens(lm, prompts, max_tokens)
    eos = set(lm.model.generation_config.eos_token_id if isinstance(lm.model.generation_config.eos_token_id, list)
              else [lm.model.generation_config.eos_token_id])
    out = []
    for server in servers:
        matches, first, compared = 0, "", "token ids"
        for prompt, ref in zip(prompts, reference, strict=True):
            ids, text = greedy_answer(server, lm.name, prompt, max_tokens, lm.tokenizer.decode(prompt))
            if ids is None:
                compared = "text"
                want = lm.tokenizer.decode([t for t in ref if t not in eos])
                same = text == want
                detail = f"{text!r} vs transformers {want!r}"
            else:
                same = list(ids) == ref
                detail = f"ids {list(ids)} vs transformers {ref}"
            matches += same
            if not same and not first:
                first = f"{lm.tokenizer.decode(prompt)!r}: {detail}"
        out.append(Agreement(server.contender, compared, matches, len(prompts), first))
    return out


# ---------------------------------------------------------------------------------------------
# The load


def measure_level(server: Server, lm: Any, workload: Workload, concurrency: int, round_: int,
                  seed: int) -> Level:
    """One load level against one server: ``workload.requests(concurrency)`` requests after the warm-up.

    A server that takes no token-id prompts gets the text those ids decode to (the same tokenizer:
    its prompt is then about, not exactly, ``input_tokens`` long), and EOS is kept from ending an
    answer by a logit bias, since it has no ``ignore_eos``.
    """
    from ..loadgen import (  # defers httpx, rich (loadgen)
        ClientConfig,
        LoadPoint,
        RunConfig,
        run_benchmark_sync,
    )
    from ..loadgen.workloads import build_workload  # defers httpx, rich (loadgen)

    options = {"input_words": workload.input_tokens, "output_tokens": workload.output_tokens,
               "range_ratio": 0.0, "token_prompts": True}
    extra = {}
    sessions_for_repeat = None
    if not server.takes_token_ids:
        stops = {lm.tokenizer.eos_token_id, *lm.tokenizer.all_special_ids}  # every end-of-generation id
        extra = {"logit_bias": {str(t): -100.0 for t in sorted(stops) if t is not None}}

        def sessions_for_repeat(repeat: int) -> list[Any]:
            sessions = build_workload("random", workload.requests(concurrency), seed=seed + repeat, **options)
            for session in sessions:
                for turn in session.turns:
                    turn.user, turn.prompt_ids = lm.tokenizer.decode(turn.prompt_ids), None
            return sessions

    cfg = RunConfig(
        ClientConfig(server.url, lm.name, endpoint="completions", timeout_s=workload.timeout_s, ignore_eos=True,
                     extra_body=extra),
        "random", [LoadPoint(concurrency=concurrency)], requests=workload.requests(concurrency),
        warmup=workload.warmup, repeats=1, seed=seed, workload_options=options)
    t0 = time.monotonic()
    results = run_benchmark_sync(cfg, quiet=True, sessions_for_repeat=sessions_for_repeat)
    row = results["pooled"][0]
    return Level(server.contender, concurrency, round_, row.get("completed", 0) + row.get("failed", 0),
                 row.get("failed", 0), row.get("output_tokens_per_s"), row.get("ttft_ms_p50"),
                 row.get("ttft_ms_p99"), row.get("itl_ms_p50"), row.get("itl_ms_p99"), row.get("tpot_ms_p50"),
                 row.get("output_tokens"), time.monotonic() - t0)


ONE_AT_A_TIME = ("hf", "llama-cpp")  # servers that decode one request at a time (batch 1 at every load)


def _ledger(contender: str, lm: Any, workload: Workload, levels: list[Level]) -> dict[int, dict[str, Any]]:
    """The ledger at each concurrency, from the decode steps alone: a step takes TPOT p50 (the median
    request's time per output token after its first), and reads the weights once for the whole batch
    (the concurrency; 1 for a server that answers one request at a time) plus each sequence's K/V.
    Weights as that engine stores them: llama.cpp its GGUF's quantized tensors and an fp16 KV cache,
    the others fp32."""
    weight_bytes, kv_dtype = None, None
    if contender == "llama-cpp":
        weight_bytes, kv_dtype = streamed_bytes(embedded_gguf_path())["bytes_per_token"], "fp16"
    copy = ledger.copy_bandwidth()
    context = ledger.mean_decode_context([workload.input_tokens], [workload.output_tokens])
    out = {}
    for c in workload.concurrencies:
        tpots = [lv.tpot_ms_p50 for lv in levels if lv.contender == contender and lv.concurrency == c
                 and lv.tpot_ms_p50]
        if tpots:
            batch = 1 if contender in ONE_AT_A_TIME else c
            decode_tps = batch * 1000.0 / statistics.median(tpots)
            step = ledger.decode_step_bytes(lm, batch, context, weight_bytes=weight_bytes, kv_dtype=kv_dtype)
            out[c] = {**ledger.ledger_row(decode_tps, batch, step, copy), "decode_tokens_per_s": decode_tps,
                      "batch": batch, "copy_how": copy.how}
    return out


def side_by_side(contenders: Sequence[str] = CONTENDERS, workload: Workload | None = None, *,
                 lm: Any = None, progress: Callable[[str], Any] | None = None,
                 servers: dict[str, Server] | None = None, keep_running: bool = False) -> SideBySide:
    """Start every available contender (each alone, timed), check its greedy answers against
    transformers, then run the interleaved rounds at each concurrency; stop what it started.

    ``servers`` reuses servers already running (e.g. started by an earlier button), and
    ``keep_running`` leaves the started ones up (they are then in the returned ``servers``).
    Contenders that cannot run here are listed in ``skipped`` with the reason.
    """
    workload = workload or Workload()
    say = progress or (lambda _msg: None)
    lm = lm if lm is not None else load_model(EMBEDDED_NAME)
    t0 = time.monotonic()
    skipped = {c: reason for c in contenders if (reason := why_unavailable(c)) is not None}
    running = dict(servers or {})
    started, order = [], []
    try:
        for name in contenders:
            if name in skipped or name in running:
                continue
            say(f"starting {LABELS[name]} ...")
            try:
                running[name] = start(name, workload, model=lm.name)
            except (RuntimeError, OSError) as exc:
                skipped[name] = str(exc).splitlines()[0]
                continue
            started.append(name)
            say(f"{LABELS[name]} answered after {running[name].start_s:.1f} s")
        order = [c for c in contenders if c in running]
        used = [running[c] for c in order]
        say("greedy answers against transformers ...")
        agree = agreement(used, lm, workload.check_tokens)
        levels = []
        for r in range(workload.rounds):
            rotated = order[r % len(order):] + order[:r % len(order)]
            for name in rotated:
                for c in workload.concurrencies:
                    seed = 1000 * (r + 1) + c  # fresh prompts per round and level, the same for every contender
                    say(f"round {r + 1}/{workload.rounds}: {LABELS[name]} at concurrency {c}")
                    levels.append(measure_level(running[name], lm, workload, c, r + 1, seed))
        memory = {}
        for server in used:
            tree = local_engines.resident_memory(server.pid)
            memory[server.contender] = tree.rss_bytes if tree else None
        ledger = {name: _ledger(name, lm, workload, levels) for name in order}
    finally:
        if not keep_running:
            for name in started:
                stop(running[name])
    return SideBySide(workload, used, levels, agree, memory, ledger, skipped, machine=env_metadata(lm),
                      command=" ".join(sys.argv), seconds=time.monotonic() - t0)


def save(result: SideBySide, folder: str | Path, date: str | None = None) -> Path:
    """Write ``engines-vllm-cpu-<date>.json`` under ``folder``; its path."""
    date = date or time.strftime("%Y-%m-%d")
    path = Path(folder) / f"engines-vllm-cpu-{date}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=1, default=str))
    return path
