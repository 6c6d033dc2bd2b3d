"""Session set-up shared by every test module."""
import atexit
import os
import shutil
import sys
import tempfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The repository root first, so that `zerogr_core`, `app.py` and `pages` come from this
# checkout (plain `pytest` only adds tests/).
sys.path.insert(0, ROOT)

# kernels/ is installed as `zerogr_kernels` (pyproject.toml); the tests must exercise this
# checkout's folder whether or not it is installed, or installed from another checkout. A link
# of that name, first on the path of this process and of the subprocesses it starts, does it.
_LINKS = tempfile.mkdtemp(prefix="zerogr_path.")
atexit.register(shutil.rmtree, _LINKS, True)
os.symlink(os.path.join(ROOT, "kernels"), os.path.join(_LINKS, "zerogr_kernels"))
sys.path.insert(0, _LINKS)
os.environ["PYTHONPATH"] = os.pathsep.join([_LINKS, ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])

# Triton picks interpreter or compiler when @triton.jit decorates a kernel, so the switch
# must be set before anything imports the kernels. Without a GPU the kernels run in the
# interpreter on CPU tensors; with one they compile (export TRITON_INTERPRET to override).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# ... and the decision is per kernel module, at its first import: import them all now, under the
# session's setting, so that no test that switches to the PyTorch references for a while
# (reference_kernels, or a fixture doing the same) decides it for the tests after it.
import importlib  # noqa: E402
import pkgutil  # noqa: E402

import zerogr_kernels  # noqa: E402

for _module in pkgutil.iter_modules(zerogr_kernels.__path__):
    importlib.import_module(f"zerogr_kernels.{_module.name}")

# Plans go to a per-session folder, never the user's ~/.cache/zerogr (a stored plan from an
# earlier run would otherwise skip the planning a test exercises); compiled kernels stay in
# Triton's usual cache, which only saves time.
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".triton", "cache"))
if not os.environ.get("ZEROGR_CACHE_DIR"):
    import atexit
    import shutil
    import tempfile

    os.environ["ZEROGR_CACHE_DIR"] = tempfile.mkdtemp(prefix="zerogr-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ZEROGR_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _reference_kernels(request, monkeypatch):
    """``@pytest.mark.reference_kernels``: the test (and the processes it starts) take the kernels'
    PyTorch references on CPU tensors, as a CPU deployment does, instead of the interpreter."""
    if request.node.get_closest_marker("reference_kernels") is not None and not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "0")


# The suite's longest tests (a 2-worker CI run, `pytest --durations`), started first: pytest-xdist
# hands tests out in collection order, and a 4-minute test handed out last kept one worker busy
# for minutes after the other had finished.
LONGEST_FIRST = (
    "test_recsys_beauty.py::test_compiled_training_step_follows_the_eager_one",
    "test_constraint_api.py::test_registered_allow_sets_match_the_row_lists_and_the_oracle",
    "test_profile_decode.py::test_quick_run_records_every_list_condition",
    "e2e/test_app_e2e.py::test_app_in_browser",
    "test_constraints.py::test_both_orders_match_the_oracle",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.removeprefix("tests/"), len(rank)))
