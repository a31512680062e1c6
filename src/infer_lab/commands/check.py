"""infer-lab check: a chapter's exercises, checked case by case on your own file."""

from __future__ import annotations

from pathlib import Path

NAME = "check"
ORDER = 12
HELP = "exercises: copy a chapter's starter, check your answers case by case, see the solution"
DESCRIPTION = """\
Every chapter has 2-4 exercises: predict a number, then let the check measure it, or write one
of the mechanisms the course teaches (a block-table lookup, the online-softmax update, the
admit rule, the speculative acceptance rule...). You work in a file of your own:

  infer-lab check 03 --init            copy the starter to ./exercises/03_memory_equation.py
                                       (never overwrites: your work is safe)
  infer-lab check 03                   import that file and run chapter 03's checks
  infer-lab check 03 --file my.py      the same on another file
  infer-lab check 03 --only max_users  just one exercise
  infer-lab check 03 --solution        the same checks on the reference solution
  infer-lab check 08 --json            the report as JSON: per exercise its status, whether it ran
                                       the engine and whether the tokens were identical
  infer-lab check 03 --show-solution   print the reference solution (try first!)
  infer-lab check --list               every chapter's exercises
  infer-lab check capstone             the capstone: serve an engine made of every part you wrote
                                       (./exercises/, or a folder with --file) next to the reference
                                       engine and HF, under the same load, in one table

Two tiers. "predict" and "implement" exercises check numbers and small functions against the
library. "build" exercises (chapters 08, 09, 12) plug your code into the real engine (the
block-table lookup, the scheduler's admission rule, speculative verification and prompt lookup),
generate on the embedded model and compare every token with transformers' greedy output; a
failure names the first diverging token with its prompt, or the engine invariant that broke.

Each check says which case failed and by how much: expected and got, their ratio, and the
mistake when the ratio gives it away (a factor of 2, GiB for GB, a forgotten layer count...).
The exit code is 0 when every check passes and 1 while any fails, so `infer-lab check 03 &&
echo done` works in a script.
"""


def add_arguments(p) -> None:
    p.add_argument("chapter", nargs="?", help="chapter number, e.g. 02 (omit with --list)")
    p.add_argument("--init", action="store_true", help="copy the chapter's starter file to --file (default "
                   "./exercises/NN_slug.py) unless it exists")
    p.add_argument("--file", default=None, help="your file (default ./exercises/NN_slug.py)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these exercises (by function name)")
    p.add_argument("--solution", action="store_true", help="run the checks on the reference solution")
    p.add_argument("--show-solution", action="store_true", help="print the reference solution")
    p.add_argument("--failures", action="store_true", help="show only the cases that fail")
    p.add_argument("--list", action="store_true", help="list every chapter's exercises")
    p.add_argument("--json", action="store_true", help="print the report as JSON (per exercise: status, "
                   "ran_engine, tokens_identical, cases)")


def _list() -> str:
    from ..course import exercises as ex

    lines = []
    for n in ex.numbers():
        lines.append(f"{ex.chapter_title(n)}    (infer-lab check {n} --init)")
        lines += [f"    {e.name:<26} {e.title} ({ex.KINDS[e.kind]})" + (f"\n    {'':<26} plugs into {e.symbol}" if e.symbol else "")
                  for e in ex.exercises(n)]
    return "\n".join(lines)


def _capstone(args) -> int:
    from ..course.exercises import capstone
    from ..models import load_model

    parts = capstone.learner_parts(Path(args.file) if args.file else capstone.DEFAULT_DIR, solution=args.solution)
    print("Your parts (" + ("the reference solutions" if args.solution else
                            f"from {args.file or capstone.DEFAULT_DIR + '/'}") + "):")
    print(capstone.parts_text(parts))
    if not any(p.written for p in parts):
        print("None of the build exercises is written yet: start with `infer-lab check 08 --init`.")
        return 1
    print("\nServing your engine, the reference engine and HF in turn, each with the same questions and load...")
    lm = load_model()
    rows = capstone.run_capstone(lm, parts)
    print(capstone.table_text(rows))
    print(capstone.machine_text(lm))
    same = capstone.identical(rows)
    print("\nEvery answer is identical to HF's greedy one." if same else
          "\nSome answers differ from HF's greedy ones: run `infer-lab check NN` on your parts to find which.")
    return 0 if same else 1


def run(args) -> int:
    from ..course import exercises as ex

    if args.list or not args.chapter:
        print(_list())
        return 0
    if args.chapter == "capstone":
        return _capstone(args)
    number = ex.exercise_module(args.chapter).NUMBER
    if args.show_solution:
        print(f"# The reference solution of chapter {number}: {ex.solution_path(number)}\n")
        print(ex.solution_source(number))
        return 0
    if args.init:
        path, created = ex.init_file(number, args.file)
        state = "created" if created else "already exists, kept as it is (nothing overwritten)"
        print(f"{path}: {state}.")
        print(f"Edit it, then run `infer-lab check {number}" + (f" --file {path}`." if args.file else "`."))
        return 0
    if args.solution:
        report = ex.check_solution(number, args.only)
    else:
        report = ex.check_file(number, args.file, args.only)
    if args.json:
        import json

        print(json.dumps(report.as_dict(), indent=2))
        return 0 if report.passed else 1
    print(report.text(only_failures=args.failures))
    if not report.passed and not args.solution:
        hint = f" --file {args.file}" if args.file else ""
        print(f"Fix the FAIL lines and run `infer-lab check {number}{hint}` again.")
    return 0 if report.passed else 1
