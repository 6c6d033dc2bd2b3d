"""The analysis notebook (docs/analysis.ipynb) runs headless, top to bottom, without a cell error.

The kernel is this interpreter: a kernel spec written into a temporary Jupyter data folder
(``JUPYTER_PATH``), so the test needs no kernel installed in the user's or the venv's
Jupyter folders and works in a fresh virtual environment.

To refresh the committed copy (outputs included) after changing the notebook or the code it
calls: ``python tests/test_notebook.py --save``.
"""
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "analysis.ipynb"
KERNEL = "zerogr-notebook"


@contextlib.contextmanager
def this_interpreter_kernel(folder: Path):
    """A kernel spec for ``sys.executable`` under ``folder``, visible to Jupyter while the block runs."""
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ZeroGR notebook kernel", "language": "python"}))
    # The kernel imports the checkout (not an installed copy) and keeps IPython's files out of $HOME.
    env = {"JUPYTER_PATH": str(folder), "IPYTHONDIR": str(folder / "ipython"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    saved = {k: os.environ.get(k) for k in (*env, "TRITON_INTERPRET")}
    os.environ.update(env)
    # The notebook runs as a user runs it: on a CPU the decoders take the PyTorch references, not
    # the Triton interpreter that conftest.py switches on for the kernel tests.
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield KERNEL
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def execute(nb, folder: Path):
    """Run every cell of ``nb`` in place (from docs/, as Jupyter would)."""
    with this_interpreter_kernel(folder) as kernel:
        nbclient.NotebookClient(nb, kernel_name=kernel, timeout=300,
                                resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb


def outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(str(out["data"].get("text/plain", "")))
    return "".join(parts)


def test_notebook_executes_without_errors(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    try:
        execute(nb, tmp_path)
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"a notebook cell failed:\n{str(err)[-3000:]}")
    text = "\n".join(outputs_text(c) for c in nb.cells if c.cell_type == "code")
    # The bad files each get their one-line error naming the file and the row.
    for name in ("not_a_number.csv", "over_codebook.csv", "shared_sid.csv"):
        line = next((ln for ln in text.splitlines() if ln.startswith(name)), f"{name}: no output")
        assert line.startswith(f"{name}, row "), line
    # Without a GPU the last section shows the recorded results and says so.
    import torch

    if not torch.cuda.is_available():
        assert "RECORDED results, not measured now" in text
    figures = sum("application/vnd.plotly.v1+json" in out.get("data", {})
                  for c in nb.cells if c.cell_type == "code" for out in c.get("outputs", []))
    assert figures >= 7  # sections 2-4 (section 5 adds the recorded figures on a CPU)


def test_committed_notebook_carries_its_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "the committed notebook must be executed"
    assert not any(out.get("output_type") == "error" for c in code for out in c.get("outputs", []))
    pngs = sum("image/png" in out.get("data", {}) for c in code for out in c.get("outputs", []))
    assert pngs >= 8, "figures need a static PNG so that they render on GitHub"
    assert NOTEBOOK.stat().st_size < 3 * 2**20


if __name__ == "__main__":
    if sys.argv[1:] != ["--save"]:
        sys.exit("usage: python tests/test_notebook.py --save  (executes docs/analysis.ipynb and saves its outputs)")
    book = nbformat.read(NOTEBOOK, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        execute(book, Path(tmp))
    for cell in book.cells:
        cell.metadata.pop("execution", None)  # per-run timestamps: noise in the diff
    book.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nbformat.write(book, NOTEBOOK)
    print(f"saved {NOTEBOOK.relative_to(ROOT)} ({NOTEBOOK.stat().st_size / 2**20:.2f} MB)")
