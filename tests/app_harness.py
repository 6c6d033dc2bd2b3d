"""Shared AppTest helpers of the app's page tests (tests/test_app_*.py).

``new_app`` starts the app (app.py) with session state set, ``open_page`` switches to a page,
``errors``, ``assert_clean`` and ``metrics`` read what the page shows, and ``needs_movielens``
skips a test when the bundled MovieLens checkpoint is missing.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

# triton.jit picks the interpreter when a kernel module is imported: imported here, under the
# suite's TRITON_INTERPRET=1, rather than first inside a reference_kernels test (which sets it to 0
# and would leave later tests a compiled kernel with no GPU driver to run it)
import zerogr_kernels.constraints  # noqa: F401,E402

from zerogr_core.recsys import movielens

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 180

needs_movielens = pytest.mark.skipif(not movielens.available(), reason="the bundled MovieLens checkpoint is missing")


def new_app(**state) -> AppTest:
    """The app (app.py), not yet run, with ``state`` set in its session state."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    for key, value in state.items():
        at.session_state[key] = value
    return at


def errors(at) -> list[str]:
    """The text of every error box on the page."""
    return [e.value for e in at.error]


def assert_clean(at) -> None:
    """No exception element and no 'Something went wrong' box on the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not any("Something went wrong" in e for e in errors(at)), errors(at)


def metrics(at) -> dict:
    """Every metric on the page, label -> value."""
    return {m.label: m.value for m in at.metric}


def open_page(at, name: str, **state) -> AppTest:
    """Switch to ``pages/<name>.py``, set ``state`` in the session state and run the page."""
    at.switch_page(f"pages/{name}.py")
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()
