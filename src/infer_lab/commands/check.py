"""infer-lab check: a chapter's exercises, or the build track's stages, checked case by case on your files."""

from __future__ import annotations

import json

NAME = "check"
ORDER = 12
HELP = "exercises and the build track: copy a starter, check your work case by case, see the solution"
DESCRIPTION = """\
Two kinds of work, each in files of your own.

Chapter exercises: every chapter has 2-4. Predict a number and let the check measure it, or
write one of the formulas the course teaches (KV bytes per token, a ring all-reduce...):

  infer-lab check 03 --init            copy the starter to ./exercises/03_memory_equation.py
                                       (never overwrites: your work is safe)
  infer-lab check 03                   import that file and run chapter 03's checks
  infer-lab check 03 --file my.py      the same on another file
  infer-lab check 03 --only max_users  just one exercise
  infer-lab check 03 --solution        the same checks on the reference solution
  infer-lab check 03 --show-solution   print the reference solution (try first!)
  infer-lab check --list               every chapter's exercises and the track's stages

The build track: write a whole serving engine, one component per stage, in ./my_engine/:

  infer-lab check engine --init        copy the eight starters to ./my_engine/
  infer-lab check engine forward       stage 1: your forward pass (01_forward.py)
  infer-lab check engine blocks        stage 2: your block manager (02_block_manager.py)
  infer-lab check engine paged         stage 3: your paged KV store and its tile loop (03_paged_kv.py)
  infer-lab check engine scheduler     stage 4: your scheduler (04_scheduler.py)
  infer-lab check engine steploop      stage 5: your step loop (05_step_loop.py)
  infer-lab check engine sampling      stage 6: your sampler and n-gram proposer (06_sampling.py)
  infer-lab check engine radix         stage 7: your radix prefix cache (07_radix_cache.py)
  infer-lab check engine tp            stage 8: your tensor-parallel layer, on 2 processes
  infer-lab check engine               every stage, then your whole engine at once
  infer-lab check engine --json        per component: yours or the library's; tokens identical?
  infer-lab check engine --serve       your engine, the library's and transformers, served under
                                       the same load in interleaved rounds: one table
  infer-lab serve --engine mine        serve your engine over the OpenAI API

A stage's check runs your component inside the real engine (every other component the
library's; `infer-lab check engine` then runs all of yours together) on hidden traces and on a
second, hidden model shape, and
compares every token with transformers' greedy output; it also checks what the stage is about
(blocks held, steps taken, the token budget, the numerics of huge scores). The traces' seed is
new each run and printed on a failure; --seed N replays it, --full runs the larger set. An
error inside your code names your function, its inputs and the line of your file.

Each check says which case failed and by how much: expected and got, their ratio, and the
mistake when the ratio gives it away (a factor of 2, GiB for GB, a forgotten layer count...).
The exit code is 0 when every check passes and 1 while any fails, so `infer-lab check 03 &&
echo done` works in a script.
"""


def add_arguments(p) -> None:
    p.add_argument("chapter", nargs="?", help="a chapter number (e.g. 02), or 'engine' for the build track "
                   "(omit with --list)")
    p.add_argument("stage", nargs="?", help="with 'engine': one stage, by key or number (forward, blocks, "
                   "paged, scheduler, steploop, sampling, radix, tp)")
    p.add_argument("--init", action="store_true", help="copy the starter(s) (chapters: to --file, default "
                   "./exercises/NN_slug.py; engine: to --dir) unless they exist")
    p.add_argument("--file", default=None, help="your file (default ./exercises/NN_slug.py)")
    p.add_argument("--dir", default=None, help="engine: your folder of stage files (default ./my_engine)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these exercises (by function name)")
    p.add_argument("--solution", action="store_true", help="run the checks on the reference solution(s)")
    p.add_argument("--show-solution", action="store_true", help="print the reference solution")
    p.add_argument("--failures", action="store_true", help="show only the cases that fail")
    p.add_argument("--list", action="store_true", help="list every chapter's exercises and the track's stages")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--seed", type=int, default=None, help="engine: replay the hidden traces of this seed")
    p.add_argument("--full", action="store_true", help="engine: the full set of hidden traces (slower)")
    p.add_argument("--serve", action="store_true", help="engine: serve your engine beside the library's and "
                   "transformers under the same load and print one table")


def _list() -> str:
    from ..course import exercises as ex  # defers torch (course)
    from ..course import track  # defers torch (course)

    lines = []
    for n in ex.numbers():
        lines.append(f"{ex.chapter_title(n)}    (infer-lab check {n} --init)")
        lines += [f"    {e.name:<26} {e.title} ({ex.KINDS[e.kind]})" + (f"\n    {'':<26} plugs into {e.symbol}" if e.symbol else "")
                  for e in ex.exercises(n)]
    lines += ["", "The build track    (infer-lab check engine --init)"]
    lines += [f"    {s.number}. {s.key:<10} {s.file:<24} {s.title} (about {s.minutes} min; read chapter "
              f"{', '.join(s.chapters)} first)"
              for s in track.stages()]
    return "\n".join(lines)


def _engine(args) -> int:
    from ..course import track  # defers torch (course)
    from ..course.track import assemble  # defers torch (course)

    folder = args.dir or track.DEFAULT_DIR
    if args.init:
        for path, created in track.init_files(folder):
            print(f"{path}: {'created' if created else 'already exists, kept as it is'}")
        print(f"Start with stage 1: edit {folder}/01_forward.py, then `infer-lab check engine forward`.")
        return 0
    if args.show_solution:
        if not args.stage:
            raise ValueError("--show-solution needs a stage: infer-lab check engine blocks --show-solution")
        s = track.stage(args.stage)
        print(f"# The reference solution of stage {s.number}: {track.solution_path(s)}\n")
        print(track.solution_path(s).read_text())
        return 0
    if args.serve:
        return _serve(folder, args.solution)
    if args.stage:
        result = track.check_one(args.stage, folder, args.solution, args.seed, args.full)
        if args.json:
            print(json.dumps(result.as_dict(), indent=2))
        else:
            print(result.text(only_failures=args.failures))
            if result.status == "missing":
                print(f"\nRun `infer-lab check engine --init` to copy the starters to {folder}/.")
        return 0 if result.passed else 1
    report = assemble.check_engine(folder, args.solution, args.seed, args.full)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.text(only_failures=args.failures))
    return 0 if report.passed else 1


def _serve(folder: str, solution: bool) -> int:
    from ..course.track import assemble, compare  # defers torch (course)
    from ..models import load_model  # defers torch (models)

    engine = assemble.learner_parts(folder, solution)
    print(f"Your engine ({'the reference solutions' if solution else folder + '/'}):\n{engine.text()}")
    if engine.reference_components == len(assemble.ALL_COMPONENTS):
        print("No stage is written yet: start with `infer-lab check engine --init`.")
        return 1
    print("\nServing your engine, the library's and transformers in turn, with the same questions and load...")
    lm = load_model()
    rows = compare.compare(lm, engine.parts)
    print(compare.table_text(rows))
    print(compare.machine_text(lm, len(rows[0].rounds)))
    same = compare.identical(rows)
    print("\nEvery answer is identical to transformers' greedy one." if same else
          "\nSome answers differ from transformers' greedy ones: `infer-lab check engine` shows which stage.")
    return 0 if same else 1


def run(args) -> int:
    from ..course import exercises as ex  # defers torch (course)

    if args.list or not args.chapter:
        print(_list())
        return 0
    if args.chapter == "engine":
        return _engine(args)
    if args.stage:
        raise ValueError(f"a second argument ({args.stage!r}) is for `infer-lab check engine STAGE` only")
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
        print(json.dumps(report.as_dict(), indent=2))
        return 0 if report.passed else 1
    print(report.text(only_failures=args.failures))
    if not report.passed and not args.solution:
        hint = f" --file {args.file}" if args.file else ""
        print(f"Fix the FAIL lines and run `infer-lab check {number}{hint}` again.")
    return 0 if report.passed else 1
