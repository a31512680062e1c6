"""Time every run button of every chapter on this machine, as a learner presses them, and save it.

Each chapter's parts run one after another at the sizes this device gets by default (quick on
a CPU), in a fresh process per chapter, with the model loaded first (as the notebook's first
cells do). The seconds of each part are what the notebook prints next to its button (rounded by
``units.fmt_duration``: "under 1 s", never "0 s"), and what ``workshop/README.md`` and
``workshop/SELF_PACED.md`` quote; ``load_s`` (imports and model load) is what the first button
of a model chapter adds in a fresh kernel. Before each chapter the script checks how many cores
other programs keep busy, stores it beside the times and warns at the end when any was busy:
measure on a quiet machine.

    python scripts/time_chapters.py                  # all chapters -> src/infer_lab/results/chapter-times-cpu-DATE.json
    python scripts/time_chapters.py --only 01 07     # some chapters (merged into the newest file)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from infer_lab.course import chapter
from infer_lab.models import load_model
ch = chapter(sys.argv[1])
lm = load_model() if ch.NEEDS_MODEL else None
load_s = time.perf_counter() - t0
sizes = ch.sizes(lm.device if lm is not None else "cpu", sys.argv[2] if len(sys.argv) > 2 else None)
result = ch.measure(lm, sizes)
print(json.dumps({"size": sizes.size, "seconds": result.seconds, "load_s": load_s,
                  "total_s": time.perf_counter() - t0}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", nargs="*", help="chapter numbers (default: all)")
    p.add_argument("--size", choices=["quick", "full"], default=None, help="default: by device")
    p.add_argument("--out", default=None, help="output file (default src/infer_lab/results/chapter-times-cpu-DATE.json)")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from infer_lab.course import chapters
    from infer_lab.harness import env_metadata
    from infer_lab.package_files import results_dir

    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    out = Path(args.out) if args.out else results_dir() / f"chapter-times-cpu-{stamp}.json"
    previous = sorted(results_dir().glob("chapter-times-cpu-*.json"))
    data = json.loads(previous[-1].read_text()) if previous and args.only else {}
    entries = data.get("data", {}).get("chapters", {})
    for entry in entries.values():  # entries merged from an earlier file keep that file's date and machine
        entry.setdefault("measured", data.get("environment", {}).get("date", "")[:10])
        entry.setdefault("hardware", data.get("environment", {}).get("hardware", ""))
    from infer_lab.timing import machine_load

    busy = []
    hardware = env_metadata().get("hardware", "")
    for ch in chapters(args.only and [f"ch{n.zfill(2)}" for n in args.only]):
        cmd = [sys.executable, "-c", CHILD, ch.NUMBER] + ([args.size] if args.size else [])
        load = machine_load(1.0)
        print(f"[time] {ch.TITLE} ... ({load.text()})", flush=True)
        if load.busy:
            busy.append(ch.NUMBER)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        entries[ch.NUMBER] = json.loads(proc.stdout.strip().splitlines()[-1])
        entries[ch.NUMBER]["others_cores_before"] = load.others_cores  # other programs' CPU use, in cores
        entries[ch.NUMBER]["measured"] = stamp
        entries[ch.NUMBER]["hardware"] = hardware
        print(f"[time] {ch.NUMBER}: " + ", ".join(f"{k} {v:.1f} s" for k, v in entries[ch.NUMBER]["seconds"].items()),
              flush=True)
    payload = {
        "kind": "chapter-times",
        "description": "Wall time of each chapter's run buttons (its parts), one process per chapter, "
                       "model loaded first; what each notebook prints next to its button.",
        "command": "python scripts/time_chapters.py " + " ".join(sys.argv[1:]),
        "environment": env_metadata(),
        "data": {"chapters": entries},
    }
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"[time] wrote {out}")
    if busy:
        print(f"[time] WARNING: other programs were using the CPU before chapter(s) {', '.join(busy)}: those "
              "times are too long for a quiet machine. Re-run them on a quiet machine (--only ...).", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
