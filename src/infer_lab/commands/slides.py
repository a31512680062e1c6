"""infer-lab slides: the workshop deck, generated from the chapters, as one HTML file."""

from __future__ import annotations

from pathlib import Path

from ._args import add_model_arguments

NAME = "slides"
ORDER = 91
HELP = "build the workshop deck (one self-contained HTML file) from the chapters"
DESCRIPTION = """\
Build the 2-hour workshop deck from the course: the agenda's sections, each chapter's findings,
figures and tables as this machine computes them, its saved GPU results, the opener and the
close, with speaker notes. One HTML file, figures embedded, no network: OUT/index.html.

  infer-lab slides --out deck --quick          measure here at quick sizes (a few minutes on a CPU)
  infer-lab slides --out deck --saved-only     no measurement: analytic parts and saved GPU results (seconds)

Open OUT/index.html in a browser. Keys: arrows or Space, n notes, s speaker view, o overview, f full screen.
"""


def add_arguments(p) -> None:
    p.add_argument("--out", default="deck", help="output folder (default: deck)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="quick sizes (the default on a CPU; a GPU gets full)")
    group.add_argument("--saved-only", action="store_true",
                       help="measure nothing: analytic parts and the saved GPU results only")
    add_model_arguments(p, dtype=False)
    p.add_argument("--only", nargs="*", help="only the chapters whose module name contains one of these")


def run(args) -> int:
    from ..course.slides.deck import BuildContext, build_deck  # defers torch (course imports it)
    from ..course.slides.render import write  # defers torch (infer_lab.course imports it)

    ctx = BuildContext(size="quick" if args.quick else None, saved_only=args.saved_only, model=args.model,
                       weights=args.weights, device=args.device, only=args.only)
    deck = build_deck(ctx)
    path = write(deck, Path(args.out))
    print(f"[slides] {len(deck.slides)} slides in {len(deck.sections)} sections: {path}")
    for failure in deck.failures:
        print(f"[slides] FAILED {failure}")
    return 1 if deck.failures else 0
