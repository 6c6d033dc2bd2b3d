"""The analysis notebook (docs/analysis.ipynb) runs headless, top to bottom, without a cell error.

The kernel is this interpreter: a kernel spec written into a temporary Jupyter data folder
(``JUPYTER_PATH``), so the test needs no kernel installed in the user's or the venv's
Jupyter folders and works in a fresh virtual environment.
"""
import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "analysis.ipynb"
KERNEL = "zerogr-notebook-test"


@pytest.fixture()
def kernel_name(tmp_path, monkeypatch):
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ZeroGR test kernel", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # The kernel imports the checkout (not an installed copy) and keeps IPython's files out of $HOME.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return KERNEL


def outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(str(out["data"].get("text/plain", "")))
    return "".join(parts)


def test_notebook_executes_without_errors(kernel_name):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=300,
                                     resources={"metadata": {"path": str(ROOT / "docs")}})
    try:
        client.execute()
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
