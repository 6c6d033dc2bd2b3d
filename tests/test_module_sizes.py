"""No source module over 600 lines (issue 15's limit): a longer one is split by topic."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 600


def source_modules():
    yield ROOT / "app.py"
    for folder in ("zerogr_core", "kernels", "pages"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_module_over_the_limit():
    modules = list(source_modules())
    assert len(modules) > 50 and all(m.is_file() for m in modules)
    long = {str(m.relative_to(ROOT)): n for m in modules if (n := len(m.read_text().splitlines())) > LIMIT}
    assert not long, f"over {LIMIT} lines: {long}"
