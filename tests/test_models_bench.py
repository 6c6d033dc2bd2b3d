"""The end-to-end benchmark's CPU mode: every method runs and the records say what they measured."""
import json

import pytest

pytest.importorskip("transformers")


def test_bench_e2e_quick(tmp_path, capsys):
    from zerogr_core.cli import main

    assert main(["bench-e2e", "--quick", "--batch", "1,2", "--device", "cpu", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "e2e-t5-fp32-4x16-2000__quick.json").read_text())
    assert doc["finished"] and doc["format"] == "zerogr-bench/1"
    assert doc["run_command"].startswith("python -m zerogr_core bench-e2e --model t5 --catalog tiger --dtype fp32 "
                                         "--preset quick")
    assert "--quick" in doc["run_command"]
    timed = [r for r in doc["records"] if r["method"] != "derived"]
    methods = {"zerogr", "zerogr-partial", "zerogr-hf-cache", "static", "unconstrained", "model-only",
               "hf-constrained", "hf-unconstrained"}
    assert {r["method"] for r in timed} == methods
    assert {(r["batch"], r["beam"]) for r in timed} == {(1, 4), (2, 4)}
    for r in timed:
        assert r["median_ms"] > 0 and r["env"]["torch"] and r["n_items"] == 2000
        if r["method"] in ("zerogr", "zerogr-partial", "zerogr-hf-cache", "static", "hf-constrained"):
            assert r["valid_fraction"] == 1.0, r
        if r["method"] in ("static", "unconstrained", "model-only"):
            assert r["loop"] == "ZeroGR beam loop, eager"
    assert all(r["valid_fraction"] is None for r in timed if r["method"] == "model-only")
    # the T5's step model runs the full last step by default, so zerogr is the full arm
    assert {r["method"]: r.get("partial_last_step") for r in timed if r["method"].startswith("zerogr")} == {
        "zerogr": False, "zerogr-partial": True, "zerogr-hf-cache": None}
    derived = [r for r in doc["records"] if r["method"] == "derived"]
    assert len(derived) == 2 and all(r["check_agrees_with_hf_cache"] and r["hf_cache_overlap"] == 1.0 for r in derived)
    for r in derived:
        assert r["speedup_vs_hf-constrained"] > 0 and r["speedup_vs_static"] > 0
        assert r["decode_share"] < 1 and r["model_only_ms"] > 0
        assert "constrained_overhead_vs_unconstrained" in r
        assert r["partial_same_items"] == 1.0 and r["partial_last_step_ratio"] > 0
    printed = capsys.readouterr().out
    assert "x HF constrained" in printed and "constrained decoding" in printed
    try:
        import plotly  # noqa: F401  (the figures need it; the benchmark does not)
    except ImportError:
        return
    from zerogr_core.bench.figures import figure_e2e, load_results

    fig = figure_e2e(load_results(tmp_path))
    assert {t.name for t in fig.data} == methods


def test_bench_e2e_bad_arguments(capsys):
    from zerogr_core.cli import main

    assert main(["bench-e2e", "--quick", "--methods", "zerogr,magic"]) != 0
    assert "unknown method 'magic'" in capsys.readouterr().err
    assert main(["bench-e2e", "--quick", "--catalog", "tiger,huge"]) != 0
    assert "--catalog: unknown value 'huge'" in capsys.readouterr().err


def test_bench_e2e_quick_decoder_only_on_both_catalogs(tmp_path):
    from zerogr_core.cli import main

    assert main(["bench-e2e", "--quick", "--model", "decoder-only", "--catalog", "tiger,search", "--dtype", "bf16",
                 "--batch", "2", "--methods", "zerogr,static,unconstrained", "--out", str(tmp_path)]) == 0
    for name in ("e2e-decoder-only-bf16-4x16-2000__quick.json", "e2e-decoder-only-bf16-5x32-3000__quick.json"):
        doc = json.loads((tmp_path / name).read_text())
        timed = [r for r in doc["records"] if r["method"] != "derived"]
        assert [r["method"] for r in timed] == ["zerogr", "static", "unconstrained"]
        assert all(r["dtype"] == "bfloat16" and r["history_items"] == 16 for r in timed)
        assert [r["valid_fraction"] for r in timed if r["method"] != "unconstrained"] == [1.0, 1.0]
    assert main(["bench-e2e", "--quick", "--model", "decoder-only", "--methods", "zerogr-hf-cache"]) != 0


def test_bench_e2e_decoder_only_default_methods_leave_out_the_t5_only_ones(tmp_path):
    from zerogr_core.cli import main

    # Asking for the decoder-only model alone must not trip over the cross-check that only the
    # T5 has: the default method list drops it, as it does when both models run. Hugging Face
    # generate runs on the model's GPT-2 twin, constrained to catalog items.
    assert main(["bench-e2e", "--quick", "--model", "decoder-only", "--batch", "1", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "e2e-decoder-only-fp32-4x16-2000__quick.json").read_text())
    timed = [r for r in doc["records"] if r["method"] != "derived"]
    # the decoder-only step model runs the partial last step by default: the other arm is the full one
    assert [r["method"] for r in timed] == ["zerogr", "zerogr-full", "static", "unconstrained", "model-only",
                                            "hf-constrained", "hf-unconstrained"]
    assert [r["partial_last_step"] for r in timed[:2]] == [True, False]
    valid = {r["method"]: r["valid_fraction"] for r in timed}
    assert valid["zerogr"] == valid["zerogr-full"] == valid["static"] == valid["hf-constrained"] == 1.0
    derived = [r for r in doc["records"] if r["method"] == "derived"]
    assert [r["partial_same_items"] for r in derived] == [1.0] and derived[0]["partial_last_step_ratio"] > 0


def test_bench_e2e_tf32_is_an_fp32_model_recorded_as_tf32(tmp_path):
    from zerogr_core.cli import main

    assert main(["bench-e2e", "--quick", "--dtype", "tf32", "--batch", "2", "--methods", "zerogr,model-only",
                 "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "e2e-t5-tf32-4x16-2000__quick.json").read_text())
    assert "--dtype tf32" in doc["run_command"]
    timed = [r for r in doc["records"] if r["method"] != "derived"]
    assert [r["method"] for r in timed] == ["zerogr", "model-only"]
    assert all(r["dtype"] == "tf32" for r in timed)
    assert timed[0]["valid_fraction"] == 1.0


def test_hf_cache_agreement_counts_shared_beams_and_their_gap():
    import torch

    from zerogr_core.bench.e2e_command import hf_cache_agreement

    ninf = float("-inf")
    ours = (torch.tensor([[1, 2, 3], [4, 5, -1]]), torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, ninf]]))
    theirs = (torch.tensor([[1, 3, 9], [5, 4, -1]]), torch.tensor([[-1.0, -3.00002, -3.1], [-1.0, -1.5, ninf]]))
    got = hf_cache_agreement(ours, theirs)
    assert got["hf_cache_overlap"] == pytest.approx((2 / 3 + 1) / 2)
    assert got["hf_cache_same_top1"] == 0.5
    assert got["hf_cache_max_score_gap"] == pytest.approx(1.0)


def test_e2e_table_takes_each_ratio_within_one_run(tmp_path):
    """A baseline's ratio divides by ZeroGR's time of the run that measured it, never by a later run's."""
    from zerogr_core.bench import e2e_table

    base = dict(suite="e2e", model_kind="t5", catalog="tiger", n_items=10 ** 6, dtype="bfloat16",
                prefill="inside the graph", batch=32, beam=128)
    runs = {"e2e-a.json": ("2026-01-01T00:00:00", {"zerogr": 2.0, "static": 3.0}),
            "e2e-b.json": ("2026-02-01T00:00:00", {"zerogr": 1.0, "hf-constrained": 100.0})}
    for name, (started, medians) in runs.items():
        records = [dict(base, method=m, median_ms=v) for m, v in medians.items()]
        (tmp_path / name).write_text(json.dumps(dict(started=started, records=records)))
    row = e2e_table.table(e2e_table.load(tmp_path)).splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "1.00 ms"                       # ZeroGR: its latest run
    assert cells[5] == "100.0 ms (100×)"               # against 1.0 ms, same run
    assert cells[7] == "3.00 ms (1.50×)", row          # against 2.0 ms, its own run, not 3.0×
