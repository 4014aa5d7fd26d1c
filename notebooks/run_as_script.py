"""Run a notebook's code cells in order, as one script: no Jupyter needed (no nbclient, nbformat,
ipykernel or IPython), e.g. on a GPU machine where those are not installed.

    PYTHONPATH=$PWD python notebooks/run_as_script.py notebooks/01_quickstart.ipynb [--figures DIR]

As in Jupyter, the cells share one namespace and run from the notebook's folder. IPython magics
(%...) and shell lines (!...) are skipped; `display` and pyplot figures are not shown but saved as
PNG under --figures (when given). Exits 1 at the first cell that raises, naming it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
import warnings
from pathlib import Path

_IPY_DISPLAY = re.compile(r"^\s*from IPython\.display import display\s*$")


def code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        # notebook-only lines; `display` comes from this runner
        lines = ["" if ln.lstrip().startswith(("%", "!")) or _IPY_DISPLAY.match(ln) else ln for ln in src.splitlines()]
        out.append("\n".join(lines))
    return out


class Figures:
    """Saves what a notebook would have shown (numbered by cell), or just closes it."""

    def __init__(self, folder: Path | None, stem: str):
        self.folder, self.stem, self.saved = folder, stem, []

    def save(self, fig, cell: int) -> None:
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            p = self.folder / f"{self.stem}-cell{cell:02d}-{len(self.saved)}.png"
            fig.savefig(p, dpi=100)
            self.saved.append(p)

    def flush(self, cell: int) -> None:
        """pyplot figures still open after a cell (Jupyter's inline backend shows them)."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            self.save(plt.figure(num), cell)
        plt.close("all")


def run(path: Path, figures: Path | None = None) -> int:
    os.environ.setdefault("MPLBACKEND", "agg")
    warnings.filterwarnings("ignore", message=".*non-interactive.*")  # plt.show() under agg
    path = path.resolve()
    figs = Figures(figures.resolve() if figures else None, path.stem)
    cell_no = 0

    def display(*objs):
        for obj in objs:
            if hasattr(obj, "savefig"):
                figs.save(obj, cell_no)
            else:
                print(repr(obj))

    ns = {"__name__": "__main__", "display": display}
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    for cell_no, src in enumerate(code_cells(path), 1):
        try:
            exec(compile(src, f"{path.name} [code cell {cell_no}]", "exec"), ns)
        except Exception:  # noqa: BLE001  (report which cell, then stop like Jupyter's run-all)
            traceback.print_exc()
            print(f"{path.name}: code cell {cell_no} failed", file=sys.stderr)
            return 1
        figs.flush(cell_no)
    print(f"{path.name}: {cell_no} code cells ran" + (f", {len(figs.saved)} figures in {figs.folder}" if figs.folder else ""))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--figures", type=Path, default=None, help="save the figures here as PNG")
    args = ap.parse_args(argv)
    return run(args.notebook, args.figures)


if __name__ == "__main__":
    sys.exit(main())
