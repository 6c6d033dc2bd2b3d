"""The "Serve your own model" example of docs/api.md runs as written."""
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_readme_hf_example_runs(capsys):
    text = API_DOC.read_text(encoding="utf-8")
    section = text.split("## Serve your own model", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    scope = {}
    exec(compile(blocks[0], "docs/api.md (Serve your own model)", "exec"), scope)
    result, catalog = scope["result"], scope["catalog"]
    ids = result.item_ids(catalog)
    assert ids.shape == (2, 3) and (ids >= 0).all()
    assert "[[" in capsys.readouterr().out
