"""An OpenAI-compatible HTTP server (FastAPI on uvicorn) over our engine or the HF baseline.

::

    from infer_lab.models import load_model
    from infer_lab.server import ServerThread, build_app
    with ServerThread(build_app(load_model(), engine="hf")) as srv:
        print(srv.url)   # point the openai client or infer-lab loadgen here
"""

from .app import APIError, ServerConfig, create_app
from .backends import Backend, GenerationRequest, HFBackend, SamplingParams
from .runner import ENGINES, ServerThread, build_app, free_port, make_backend, serve

__all__ = [
    "APIError",
    "ServerConfig",
    "create_app",
    "Backend",
    "GenerationRequest",
    "HFBackend",
    "SamplingParams",
    "ENGINES",
    "ServerThread",
    "build_app",
    "free_port",
    "make_backend",
    "serve",
]
