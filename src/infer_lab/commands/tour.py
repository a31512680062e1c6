"""infer-lab tour: every chapter headless, one report."""

from __future__ import annotations

from pathlib import Path

from ._args import add_model_arguments

NAME = "tour"
ORDER = 90
HELP = "run every course module headless and write report.md, results.json and figures"
DESCRIPTION = """\
Run every course module's measurements headless (the instructor's pre-run, and our
end-to-end check). Writes OUT/report.md, OUT/results.json and PNG figures.

  infer-lab tour --quick                         sized for a 2-core CPU, a few minutes
  infer-lab tour --model mistral-7b --weights random --device cuda   7B shape on a GPU

Random weights give true memory and timing with no download; their text is meaningless.
"""


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes: a few minutes on a 2-core CPU")
    p.add_argument("--out", default="tour-report", help="output folder (default: tour-report)")
    add_model_arguments(p, dtype=False)
    p.add_argument("--only", nargs="*",
                   help="run only the chapters whose module name contains one of these (e.g. ch02 ch03)")


def run(args) -> int:
    from ..course.tour import TourContext, run_tour  # defers torch (infer_lab.course imports it)

    ctx = TourContext(out_dir=Path(args.out), quick=args.quick, model=args.model, weights=args.weights,
                      device=args.device)
    results = run_tour(ctx, only=args.only)
    failed = [k for k, v in results["chapters"].items() if not v["ok"]]
    print(f"[tour] report: {Path(args.out) / 'report.md'}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
