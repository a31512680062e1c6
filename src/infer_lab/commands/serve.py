"""infer-lab serve: an OpenAI-compatible HTTP server on our engine or the HF baseline."""

from __future__ import annotations

import os
import sys

import infer_lab

from ._args import add_model_arguments

NAME = "serve"
ORDER = 60
HELP = "serve a model over an OpenAI-compatible HTTP API (our engine, or HF one request at a time)"
DESCRIPTION = """\
Serve a model over the OpenAI API: POST /v1/completions, POST /v1/chat/completions (with the
model's chat template), GET /v1/models, GET /health, GET /version and GET /metrics (Prometheus:
running/waiting requests, KV blocks used/total, prefix-cache hits, TTFT/ITL/E2E histograms,
tokens generated). Streaming is SSE ending with `data: [DONE]`; add
"stream_options": {"include_usage": true} to get token counts in the last chunk.

  infer-lab serve                                     embedded SmolLM2-135M, our engine, port 8000
  infer-lab serve --engine hf                         the naive baseline: one request at a time
  infer-lab serve --speculative ngram                 prompt-lookup speculation (see /metrics)
  infer-lab serve --kv-dtype int8                     int8 KV blocks: about 3.8x the tokens per GB
  infer-lab serve --engine-option compiled_decode=on  CPU: a lone client's decode steps compiled
  infer-lab serve --model mistral-7b --weights random --device cuda --api-key secret
  infer-lab serve --engine mine                       the engine you wrote in the build track (./my_engine/)

Then, from another terminal:

  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}'

or the official client:  openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none").
It binds 127.0.0.1 only unless you pass --host 0.0.0.0 (then set a key). Give the key in the
environment variable INFER_LAB_API_KEY or in a file (--api-key-file PATH): --api-key KEY works
too, but every local user can read a command line (ps, /proc/PID/cmdline). With a key,
/v1/*, /version and /openapi.json need 'Authorization: Bearer KEY'; /health stays open, and so
does /metrics (as in vLLM, for Prometheus scrapers) unless you add --protect-metrics.

Hostile or broken clients cannot hold the server:
  a connection must send its headers within --header-timeout s and its body within
  --body-timeout s (408, closed); at most --max-connections stay open (past that the oldest
  idle or slow one is closed); at most --max-queued requests wait for an engine slot and
  none longer than --queue-timeout s (503 with Retry-After); a stream whose client stops
  reading is paused once --stream-buffer-tokens tokens wait for it (its batch slot and KV
  blocks go back to the others) and resumes, recomputed, when the client reads again; a
  client that takes no byte for --send-timeout s has its connection closed.
  A prompt longer than the context, judged from its byte length, is refused before it is
  tokenized. /metrics shows the queues, the open connections and what was refused.

Bodies must be JSON with 'Content-Type: application/json' (anything else gets a 415) and at
most --max-body-bytes long (413). Token ids must be in the model's vocabulary, a seed a
signed 64-bit integer, stop at most 4 strings of at most 256 characters, messages at most
2048 (400). Parameters the server does not implement (tools, response_format, echo, best_of,
suffix, streamed logprobs, penalties other than their no-op values) and unknown ones get a 400
that names them: never a 200 that silently ignores them. usage.completion_tokens counts the EOS
that ended an answer, as vLLM and OpenAI do; "return_token_ids": true returns the prompt's and
the answer's token ids in vLLM's fields. n (up to 16 answers) is served; with a prefix cache
(--engine-option prefix_cache=radix) the answers share the prompt's KV blocks. The OpenAPI description of every route and body is at
GET /openapi.json.

Ctrl-C stops accepting requests and lets in-flight ones finish for up to --shutdown-timeout
seconds; then streams end with an error event and other requests get a 503 error body.

A server owns its cores: its engine steps on the main thread and idle OpenMP threads spin
briefly before they sleep (--omp-wait spin), which made decoding 10-20 % faster here. On a
machine you share with other work, --omp-wait passive sleeps at once (the course's default).
"""

API_KEY_ENV = "INFER_LAB_API_KEY"


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument(
        "--engine",
        choices=["ours", "hf", "mine"],
        default="ours",
        help="ours: the library's engine; hf: transformers, one request at a time; mine: the engine your "
             "build-track files make (see --my-engine) (default: ours)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to bind (default 127.0.0.1: this machine only)",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/*, /version and /openapi.json; "
        f"prefer ${API_KEY_ENV} or --api-key-file (a command line is visible to local users)",
    )
    p.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="read the API key from this file (its first line)",
    )
    p.add_argument(
        "--protect-metrics",
        action="store_true",
        help="require the API key on /metrics too (default: open, as in vLLM)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body accepted, in bytes; larger ones get a 413 (default 2 MiB)",
    )
    p.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: --model)"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="prompt + answer limit in tokens (default: the model's max_position_embeddings)",
    )
    lim = p.add_argument_group("limits against slow, silent or greedy clients")
    lim.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                     help="seconds a connection has to send its request line and headers (default 10)")
    lim.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                     help="seconds a request has to send its whole body after its headers (default 30)")
    lim.add_argument("--max-connections", type=int, default=None, metavar="N",
                     help="open connections allowed; past it the oldest idle or slow one is closed "
                          "(default: half the file-descriptor limit less 48, at most 1024; "
                          "the other half is room for bursts)")
    lim.add_argument("--max-queued", type=int, default=512, metavar="N",
                     help="requests that may wait for an engine slot; more get a 503 (default 512)")
    lim.add_argument("--queue-timeout", type=float, default=300.0, metavar="S",
                     help="seconds a request may wait for its first token before a 503 (default 300)")
    lim.add_argument("--stream-buffer-tokens", type=int, default=16, metavar="N",
                     help="tokens a stream may hold for a client that stopped reading, beyond the "
                          "socket buffers (2 KiB unsent per connection), before it is paused and "
                          "its slot and KV blocks freed (default 16)")
    lim.add_argument("--send-timeout", type=float, default=60.0, metavar="S",
                     help="seconds a client may take no byte of its stream before its connection "
                          "is closed and its request cancelled (default 60)")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish on Ctrl-C; then they are cancelled, "
        "streams with an error event, the others with a 503 error body",
    )
    p.add_argument(
        "--omp-wait", choices=["spin", "passive"], default="spin",
        help="idle OpenMP threads: spin briefly before sleeping (a server that owns its cores; default) "
        "or sleep at once (passive: kinder to other programs on a shared machine)",
    )
    g = p.add_argument_group("engine flags (--engine ours)")
    g.add_argument("--kv-dtype", choices=["auto", "int8", "fp8"], default="auto",
                   help="KV cache storage: the model's dtype, or int8 / fp8 with per-token per-head scales")
    g.add_argument("--speculative", default=None, metavar="ngram|self:L",
                   help="speculative decoding: n-gram prompt lookup, or the model's own first L layers as "
                        "the draft; /metrics then counts proposed and accepted tokens")
    g.add_argument("--num-speculative-tokens", type=int, default=4, metavar="K",
                   help="tokens guessed per step with --speculative (default 4)")
    g.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to our engine's config, e.g. block_size=16 or prefix_cache=radix; repeatable",
    )
    g.add_argument("--my-engine", default="my_engine", metavar="DIR",
                   help="with --engine mine: your build-track files (default ./my_engine/); every component you "
                        "wrote replaces the library's, and the radix prefix cache, n-gram speculation and "
                        "chunked prefill are on so that each of them runs (--engine-option overrides)")


def _parse_options(items: list[str]) -> dict:
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--engine-option needs KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        low = value.lower()
        if low in ("true", "on", "yes"):
            out[key] = True
        elif low in ("false", "off", "no"):
            out[key] = False
        else:
            try:
                out[key] = int(value)
            except ValueError:
                try:
                    out[key] = float(value)
                except ValueError:
                    out[key] = value
    return out


def resolve_api_key(args, environ=None) -> str | None:
    """The key from --api-key, --api-key-file or $INFER_LAB_API_KEY (at most one of them)."""
    environ = os.environ if environ is None else environ
    given = {
        "--api-key": args.api_key,
        "--api-key-file": args.api_key_file,
        f"${API_KEY_ENV}": environ.get(API_KEY_ENV) or None,
    }
    chosen = [name for name, value in given.items() if value]
    if len(chosen) > 1:
        raise ValueError(f"give the API key one way only, got {' and '.join(chosen)}")
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
        key = lines[0].strip() if lines else ""
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file}: the file is empty")
        return key
    return args.api_key or environ.get(API_KEY_ENV) or None


# Why a server spins, and why its engine steps on the main thread (2-core AMD EPYC, torch 2.13 CPU,
# libgomp; 2026-12-04). A decode step of the embedded model is a few hundred small parallel regions.
# - Between regions, a thread told to sleep at once (OMP_WAIT_POLICY=PASSIVE) must be woken for the
#   next one: a 200k-element torch.add took 45-57 us that way against 12 us with libgomp spinning.
# - libgomp keeps one worker pool per thread that starts regions. While a second pool exists (the
#   main thread loaded the model, a server thread then steps the engine) it counts more threads
#   than cores and spins only briefly (its throttled count): the same add took 46 us on the second
#   thread, 12 us on the main.
# So `infer-lab serve` steps the engine on the main thread (server/runner.py) and spins 10,000 times
# before sleeping. Measured through HTTP with the engine on the main thread, one server
# at a time, 128-token prompts, 64 output tokens, 2 x concurrency requests, two rounds each
# (unsaved; the saved side-by-side of 2026-12-04 measured later and higher):
#   concurrency        1            4              16
#   PASSIVE            34.7, 35.8   101.3, 100.8   208.3, 206.8   output tokens/s
#   GOMP_SPINCOUNT     40.8, 38.9   119.7, 123.3   248.1, 217.2
# Beside two CPU hogs a spinning engine decoded 2-3x slower than a passive one, so the library
# and the notebooks stay passive (infer_lab/__init__.py), and a server on a shared machine takes
# --omp-wait passive.
SERVE_SPINCOUNT = 10_000  # libgomp spins before an idle OpenMP thread sleeps, in `infer-lab serve`


def choose_wait_policy(wait: str) -> str:
    """Set OpenMP's wait policy for this server process before torch loads; what applies, in words.

    ``spin``: an idle OpenMP thread spins ``SERVE_SPINCOUNT`` times before it sleeps, so the many
    small parallel regions of a decode step do not each wait for a woken thread (a server owns
    its cores). ``passive``: sleep at once, the course's default for shared machines
    (infer_lab/__init__.py). A policy you set in the environment wins over both.
    """
    if infer_lab.OMP_WAIT_POLICY_SET_BY == "you":
        return "your OMP_WAIT_POLICY / GOMP_SPINCOUNT"
    if "torch" in sys.modules:
        return "the policy torch loaded with (it was imported before the server could choose)"
    if wait == "spin":
        os.environ.pop("OMP_WAIT_POLICY", None)
        os.environ["GOMP_SPINCOUNT"] = str(SERVE_SPINCOUNT)
        return f"spin {SERVE_SPINCOUNT:,} times, then sleep (--omp-wait spin)"
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ.pop("GOMP_SPINCOUNT", None)
    return "sleep at once (--omp-wait passive)"


def run(args) -> int:
    policy = choose_wait_policy(args.omp_wait)  # before anything imports torch
    from ..models import load_model  # defers torch (models)
    from ..server import serve  # defers fastapi, torch (server)
    from ..server.app import DEFAULT_MAX_BODY_BYTES  # defers fastapi, torch (server)

    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    max_body = DEFAULT_MAX_BODY_BYTES if args.max_body_bytes is None else args.max_body_bytes
    if max_body < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    api_key = resolve_api_key(args)
    if args.protect_metrics and not api_key:
        raise ValueError(f"--protect-metrics needs an API key (--api-key-file, ${API_KEY_ENV})")
    options = _parse_options(args.engine_option)
    if args.kv_dtype != "auto":
        options["kv_dtype"] = args.kv_dtype
    if args.speculative:
        options.update(speculative=args.speculative, num_speculative_tokens=args.num_speculative_tokens)
    if options and args.engine == "hf":
        raise ValueError("--engine-option, --kv-dtype and --speculative apply to --engine ours or mine only")
    parts = None
    if args.engine == "mine":
        parts, defaults = _learner_engine(args.my_engine)
        options = {**defaults, **options}
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print("[serve] warning: listening beyond this machine without --api-key", file=sys.stderr)
    lm = load_model(args.model, weights=args.weights, device=args.device, dtype=args.dtype)
    print(f"[serve] idle OpenMP threads: {policy}", file=sys.stderr)
    print(
        f"[serve] {lm.describe()} with engine {args.engine} on http://{args.host}:{args.port}"
        + (f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""),
        file=sys.stderr,
    )
    serve(
        lm,
        engine="hf" if args.engine == "hf" else "ours",
        host=args.host,
        port=args.port,
        api_key=api_key,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        shutdown_timeout_s=args.shutdown_timeout,
        max_body_bytes=max_body,
        protect_metrics=args.protect_metrics,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=args.max_connections,
        max_queued=args.max_queued,
        queue_timeout_s=args.queue_timeout,
        stream_buffer_tokens=args.stream_buffer_tokens,
        send_timeout_s=args.send_timeout,
        parts=parts,
        **options,
    )
    return 0


def _learner_engine(folder: str):
    """The components written in ``folder`` (said on stderr) and the switches that make them all run."""
    from ..course.track import assemble  # defers torch (course)

    engine = assemble.learner_parts(folder)
    print(f"[serve] your engine from {folder}/:\n{engine.text()}", file=sys.stderr)
    if engine.reference_components == len(assemble.ALL_COMPONENTS):
        raise ValueError(f"no stage of the build track is written in {folder}/ yet: start with "
                         "`infer-lab check engine --init`")
    if engine.owners["tp"] == "yours":
        print("[serve] (your tensor-parallel layer runs in `infer-lab check engine tp`: this server is one "
              "process)", file=sys.stderr)
    return engine.parts, dict(assemble.SERVE_OPTIONS)
