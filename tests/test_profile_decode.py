"""The kernel-profile script's CPU dry run, with and without per-request lists (every kind's
list is built by the constraints suite's own helper, tested there)."""
import json

import pytest

from zerogr_core.bench.profile_decode import main, parse_lists


def test_quick_run_records_every_list_condition(tmp_path):
    out = tmp_path / "profile.json"
    assert main(["--quick", "--shapes", "fp16:2", "--lists", "none,deny-catalog:5", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["lists"], r["listed_per_request"]) for r in runs] == [("none", 0), ("deny-catalog", 5)]
    assert all(r["batch"] == 2 and r["median_ms"] > 0 and r["plan"] for r in runs)


@pytest.mark.parametrize("text", ["deny", "deny:x", "keep:5", "none:3"])
def test_bad_list_conditions_are_named(text):
    with pytest.raises(SystemExit, match=f"--lists: '{text}'"):
        parse_lists(text)
