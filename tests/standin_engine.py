"""A stand-in for vLLM's or llama.cpp's server: the same HTTP interface, no model, no install.

``INFER_LAB_LOCAL_ENGINE_STANDIN="python tests/standin_engine.py"`` makes
:func:`infer_lab.local_engines.launch` start this instead of the real engine, so tests exercise
the launcher, the load generator and the side-by-side table without downloading an engine. It
imitates each engine's differences that the course relies on: as vLLM (``--engine-name
vllm-cpu``) it takes token-id prompts, returns ``token_ids`` and streams usage; as llama-cpp-python
it takes text prompts only, answers health on ``/v1/models``, streams no usage and sends no chunk
for its first token (one that completes no character). Its "tokens"
are the prompt's last id repeated, each streamed after ``--token-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def build(engine: str, model: str, token_ms: float) -> FastAPI:
    app = FastAPI()
    is_vllm = engine == "vllm-cpu"

    if is_vllm:
        @app.get("/health")
        async def health() -> dict:
            return {}

        @app.get("/version")
        async def version() -> dict:
            return {"version": "0.0-standin"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and not is_vllm:
            return JSONResponse({"error": "prompt must be text"}, status_code=422)
        ids = prompt if isinstance(prompt, list) else [len(str(prompt))]
        n = int(body.get("max_tokens") or 16)
        out = [ids[-1]] * n
        usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
        if not body.get("stream"):
            choice = {"index": 0, "text": " x" * n, "finish_reason": "length"}
            if is_vllm and body.get("return_token_ids"):
                choice["token_ids"] = out
            return {"id": "cmpl-standin", "object": "text_completion", "model": model, "choices": [choice],
                    "usage": usage}

        async def events():
            for i in range(n):
                await asyncio.sleep(token_ms / 1000)
                if not is_vllm and i == 0 and n > 1:
                    continue  # as llama.cpp: a token that completes no character sends no chunk
                last = "length" if i == n - 1 else None
                chunk = {"id": "cmpl-standin", "choices": [{"index": 0, "text": " x", "finish_reason": last}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            if is_vllm and (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({'id': 'cmpl-standin', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engine-name", required=True, choices=["vllm-cpu", "llama-cpp"])
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--token-ms", type=float, default=2.0)
    args = p.parse_args()
    uvicorn.run(build(args.engine_name, args.served_model_name, args.token_ms), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
