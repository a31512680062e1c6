"""The ``infer-lab`` command line. Each subcommand lives in ``infer_lab/commands/<name>.py``.

A command module defines ``NAME``, ``HELP``, ``ORDER`` (position in ``--help``),
``add_arguments(parser)`` and ``run(args) -> int``. Modules are discovered, so adding a
command never edits this file; heavy imports stay inside ``run`` so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import textwrap

from . import commands as _commands

DESCRIPTION = textwrap.dedent(
    """\
    infer-lab: LLM inference at scale, measured on your own hardware.

    Every command works on a CPU laptop with the embedded SmolLM2-135M (real weights, no
    download) and uses a CUDA GPU automatically when one is present.

    Start here:
      infer-lab env                      what hardware you have, and its measured ceilings
      infer-lab generate "Hello"         a completion from the embedded model, with TTFT/ITL
      infer-lab tour --quick             every module headless; writes a report with figures
    """
)


def _command_modules():
    mods = []
    for info in pkgutil.iter_modules(_commands.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{_commands.__name__}.{info.name}")
        if hasattr(mod, "add_arguments") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with one subparser per discovered command module."""
    parser = argparse.ArgumentParser(
        prog="infer-lab", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"infer-lab {__import__('infer_lab').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        p = sub.add_parser(
            mod.NAME,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``infer-lab`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:
        # `infer-lab roofline ... | head` closed the pipe early: that is not an error.

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as exc:
        # Bad input or an environment problem: one clear line, no traceback.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"infer-lab {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
