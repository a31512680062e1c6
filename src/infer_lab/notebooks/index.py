# The course index: `make workshop` opens this page. Each title opens its chapter's notebook.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import chapters, index
    return chapters, index, mo


@app.cell(hide_code=True)
def _(chapters, index, mo):
    mo.md(f"""
    # LLM inference at scale: the course

    {len(chapters())} chapters, each one notebook. Open them in order: click a title. Opening a notebook
    runs its cheap cells at once; every measurement waits for its run button, and the line
    next to each button says how long it takes.

    {index.index_markdown()}

    - **workshop**: minutes in the 2-hour workshop (a section's time split over its chapters).
    - **run buttons**: how many, and how long all of them take pressed once. {index.times_source()}
    - **the model** is the embedded SmolLM2-135M (real weights, shipped in a Python package; a GPU
      uses a 7B-shaped model instead). The first load on a machine converts it once, which takes
      longer than the later loads.
    - **Memory:** a notebook's kernel stops when you close its tab (`make workshop` starts the
      server with marimo's `--session-ttl`), so close a chapter's tab before opening the next
      and the course stays within a laptop's memory. Reopening a notebook starts it afresh.
    - A timed part checks whether other programs are using the CPU before it trusts its
      numbers; when they are, the page says so. Close other heavy programs for clean timings.
    """)
    return


if __name__ == "__main__":
    app.run()
