#!/usr/bin/env bash
# The prepared GPU check: the whole tour on a Mistral-7B-shape model with random bf16 weights,
# built on the GPU (no download). Run it in one go on a lent GPU machine, then copy
# $OUT/results-*.json into src/infer_lab/results/ (it records hardware, versions, date and command).
#
#   OUT=/some/dir bash scripts/gpu_tour.sh          # defaults: mistral-7b, random, cuda, full sizes
#   MODEL=smollm2-135m WEIGHTS=pretrained DEVICE=cpu ONLY="m00" QUICK=--quick bash scripts/gpu_tour.sh
#
# A GPU image without pip access can take wheels from .whl/ (tabulate for the report tables,
# fastapi/uvicorn/httpx for module 12): they are installed into /tmp/site first.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
MODEL=${MODEL:-mistral-7b}
WEIGHTS=${WEIGHTS:-random}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export PYTHONUNBUFFERED=1
stamp=$(date -u +%Y-%m-%d)
python3 -m infer_lab env --json --full > "$OUT/env-$stamp.json"
cmd=(python3 -m infer_lab tour $QUICK --model "$MODEL" --weights "$WEIGHTS" --device "$DEVICE" --out /tmp/infer-lab-tour)
[ -n "${ONLY:-}" ] && cmd+=(--only $ONLY)
status=0
"${cmd[@]}" || status=$?
python3 - "$OUT/results-$MODEL-$DEVICE-$stamp.json" "${cmd[*]}" <<'PY'
import json, sys
data = json.load(open("/tmp/infer-lab-tour/results.json"))
data["command"] = sys.argv[2]
json.dump(data, open(sys.argv[1], "w"), indent=1)
PY
cp /tmp/infer-lab-tour/report.md "$OUT/report-$MODEL-$DEVICE-$stamp.md"
exit $status
