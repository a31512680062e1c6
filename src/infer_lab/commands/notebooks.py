"""infer-lab notebooks: where the course's marimo notebooks are, in a clone or an installed package."""

from __future__ import annotations

from ..package_files import notebooks_dir

NAME = "notebooks"
ORDER = 11
HELP = "print where the course's marimo notebooks are (a clone's, or the installed package's)"
DESCRIPTION = """\
The notebooks ship inside the package, so a plain `pip install` (a wheel, an sdist or git+<address>)
has them as well as a clone. This prints their folder, or one chapter's notebook:

  infer-lab notebooks                         the folder (src/infer_lab/notebooks in a clone)
  infer-lab notebooks 08                      chapter 08's notebook
  marimo edit "$(infer-lab notebooks)"        open the course (index.py is its first page)
  marimo edit "$(infer-lab notebooks 08)"     open one chapter

$INFER_LAB_NOTEBOOKS points the course at another folder (your own copy of the notebooks).
"""


def add_arguments(p) -> None:
    p.add_argument("chapter", nargs="?", help="a chapter number (e.g. 08) or 'index'; omit for the folder")


def run(args) -> int:
    from ..course.notebook_code import notebook_path  # defers torch (infer_lab.course imports it)

    if args.chapter is None:
        print(notebooks_dir())
    elif args.chapter == "index":
        path = notebooks_dir() / "index.py"
        if not path.is_file():
            raise FileNotFoundError(f"no index.py in {notebooks_dir()}")
        print(path)
    else:
        print(notebook_path(args.chapter.zfill(2)))
    return 0
