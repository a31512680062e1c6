"""infer-lab models: the catalogued architectures."""

from __future__ import annotations

import json

from ..analysis.params import param_counts
from ..catalog import list_models, model_info

NAME = "models"
ORDER = 15
HELP = "list the catalogued model architectures (exact parameter counts)"
DESCRIPTION = """\
List the architectures in the model catalog. Each loads with --weights random (exact shape,
built on the device, nothing downloaded) and, with network access, with --weights pretrained
from its hub id. smollm2-135m is embedded: real weights, no network needed.

  infer-lab models
  infer-lab models --json
"""


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON on stdout")


def run(args) -> int:
    rows = []
    for name in list_models():
        info = model_info(name)
        # Counted from the config (the tests check it equals a meta-device build): instant.
        rows.append({"name": name, "params": param_counts(name).total, "hub_id": info.get("hf_id"),
                     "embedded": bool(info.get("embedded")), "notes": info.get("notes", "")})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        flag = " (embedded)" if r["embedded"] else ""
        print(f"{r['name']:<18}{r['params']:>18,} params  {r['hub_id']}{flag}")
    return 0
