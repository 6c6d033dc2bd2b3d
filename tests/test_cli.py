"""``python -m zerogr_core``: each subcommand end to end, and one-line errors without tracebacks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zerogr_core.catalog.io import load_catalog
from zerogr_core.cli import REGISTRARS, build_parser, main
from zerogr_core.index import BUILDERS

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zerogr_core", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# ---------------------------------------------------------------------------- subprocess runs
def test_every_readme_sample_name_works_and_unknown_names_list_them(capsys):
    code, out, _ = run_main(capsys, "stats", "movielens")
    assert code == 0 and "9,742" in out
    code, _, err = run_main(capsys, "stats", "nosuch")
    assert code == 1 and err.count("\n") == 1
    for name in ("search-like-small", "watch-like-small", "synthetic-7-small", "tiny", "movielens"):
        assert name in err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["stats", "--help"])
    assert "movielens" in capsys.readouterr().out


def test_index_json_subprocess():
    result = run_cli("index", "tiny", "--json", "--dense-steps", "3")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [s["states"] for s in report["steps"]] == [1, 4, 8]
    assert [s["entries"] for s in report["steps"]] == [4, 8, 12]
    assert report["steps"][2]["kind"] == "dense"
    assert set(report["builders"]) == set(BUILDERS)
    assert all(timing["total_s"] >= 0 for timing in report["builders"].values())
    assert report["sid_table_int16_bytes"] == 12 * 3 * 2
    assert report["total_bytes"] == sum(s["bytes"] for s in report["steps"])


def test_next_subprocess():
    result = run_cli("next", "tiny", "--prefix", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["step 2: 3 valid next tokens after 0", "0 1 2"]


def test_synth_then_stats_subprocess(tmp_path):
    out = tmp_path / "w.parquet"
    result = run_cli("synth", "synthetic-7", "--n", "2e3", "--out", str(out), "--seed", "4", "--codebook", "64")
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    catalog = load_catalog(out)
    assert catalog.n_items == 2000 and catalog.codebook_sizes == (64,) * 7
    stats = run_cli("stats", str(out), "--json")
    assert stats.returncode == 0, stats.stderr
    payload = json.loads(stats.stdout)
    assert payload["items"] == 2000 and payload["levels"] == 7
    assert payload["steps"] == json.loads(json.dumps(catalog.step_stats()))


def test_malformed_catalog_subprocess(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("item_id,s1,s2\n1,2,3\n2,x,3\n")
    for command in (["stats", str(bad)], ["index", str(bad), "--json"]):
        assert_one_line_error(run_cli(*command), str(bad), "row 2", "column 's1'", "'x' is not an integer")


def test_usage_errors_subprocess():
    assert_one_line_error(run_cli(), "required")
    assert_one_line_error(run_cli("frobnicate"), "invalid choice")


# ---------------------------------------------------------------------------- in-process runs
def run_main(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_index_text_output(capsys):
    code, out, err = run_main(capsys, "index", "synth:search-like:3000", "--builders", "layout,serial")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("search-like-3000: 3,000 items, 5 levels, codebooks 8192/4096/2048/2048/2048")
    assert lines[1].split() == ["step", "codebook", "states", "entries", "density", "max_segment", "kind", "bytes"]
    assert len(lines) == 2 + 5 + 1 + 2
    assert "× the int16 SID table" in lines[7] and "STATIC-style" in lines[7]
    assert lines[8].startswith("build layout:") and lines[9].startswith("build serial:")


def test_stats_text_output(capsys):
    code, out, _ = run_main(capsys, "stats", "tiny")
    assert code == 0
    assert out.splitlines()[0] == "tiny: 12 items, 3 levels, codebooks 4/4/4"
    assert out.splitlines()[-1].split() == ["3", "4", "8", "12", "0.375", "2", "1.5"]
    code, out, _ = run_main(capsys, "stats", "search-like-small")
    assert "band offsets 0/8192/12288/14336/16384" in out


def test_declared_sizes_and_collision(capsys, tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("item_id,s1,s2\n1,0,1\n2,0,1\n3,1,0\n")
    code, _, err = run_main(capsys, "stats", str(path))
    assert code == 1 and "collision" in err
    code, out, _ = run_main(capsys, "stats", str(path), "--collision", "--codebook-sizes", "4,4", "--json")
    payload = json.loads(out)
    assert code == 0 and payload["codebook_sizes"] == [4, 4, 2] and payload["collision_level_added"]
    code, _, err = run_main(capsys, "stats", str(path), "--codebook-sizes", "4,z")
    assert code == 2 and err == "error: --codebook-sizes: 'z' is not an integer\n"


def test_next_last_step_names_items(capsys):
    code, out, _ = run_main(capsys, "next", "tiny", "--prefix", "1,0", "--json")
    assert code == 0 and json.loads(out) == {"prefix": [1, 0], "step": 3, "tokens": [0, 2], "item_ids": [105, 106],
                                             "titles": ["Harbour Lights", "Harbour Nights"]}
    code, out, _ = run_main(capsys, "next", "tiny", "--prefix", "1,0")
    assert out.splitlines()[1:] == ["0\titem 105\tHarbour Lights", "2\titem 106\tHarbour Nights"]


def test_next_edge_cases(capsys):
    code, out, _ = run_main(capsys, "next", "tiny", "--prefix", "", "--json")
    assert code == 0 and json.loads(out)["tokens"] == [0, 1, 2, 3]
    code, _, err = run_main(capsys, "next", "tiny", "--prefix", "0,0,0")
    assert code == 2 and "at most 2" in err
    code, _, err = run_main(capsys, "next", "tiny", "--prefix", "0;1")
    assert code == 2 and "--prefix" in err
    code, _, err = run_main(capsys, "next", "tiny", "--prefix", "0,9")
    assert code == 1 and err == "error: prefix 0,9 is not in the catalog (token 9 at step 2)\n"


@pytest.mark.parametrize("args, fragment", [
    (["index", "tiny", "--dense-steps", "4"], "--dense-steps: step 4 is outside 1…3"),
    (["index", "tiny", "--dense-steps", "2", "--sparse-steps", "2"], "step 2 is in both"),
    (["index", "tiny", "--builders", "magic"], "unknown builder 'magic'"),
    (["index", "tiny", "--builders", ","], "name at least one builder"),
    (["synth", "watch-like", "--n", "ten", "--out", "x.csv"], "--n: 'ten' is not a whole number"),
    (["synth", "watch-like", "--n", "10", "--out", "x.xlsx"], "unsupported extension"),
    (["synth", "nope", "--n", "10", "--out", "x.csv"], "unknown synthetic kind 'nope'"),
    (["stats", "synth:search-like"], "expected synth:KIND:N"),
    (["stats", "missing.parquet"], "missing.parquet: no such file"),
    (["plan", "tiny", "--beam", "0"], "--batch, --beam and --hidden must be ≥ 1"),
    (["plan", "tiny", "--dtype", "fp8"], "dtype must be one of"),
    (["plan", "tiny", "--override", "full,full"], "plan override lists 2 steps, the index has 3"),
    (["plan", "tiny", "--override", "full,sparse+full/fast,full"], "step option must look like"),
    (["index", "tiny", "--device", "nonsense"], "--device: 'nonsense' is not a device"),
    (["synth", "search-like", "--n", "10", "--out", "x.csv", "--codebook", "3e9"],
     "codebook must be in [1, 2147483648]"),
    (["next", "synth:synthetic-7:100:0:1e12", "--prefix", ""], "codebook must be in [1, 2147483648]"),
    (["plan", "tiny", "--device", "meta"], "--device: 'meta': choose cpu, cuda"),
    (["bench", "--quick", "--device", "bogus"], "--device: 'bogus' is not a device"),
    (["bench", "--quick", "--budget-s", "nan"], "--budget-s: must be a positive number of seconds, got nan"),
    (["bench", "--quick", "--budget-s", "-5"], "--budget-s: must be a positive number of seconds, got -5"),
    (["bench", "--quick", "--suite-budgets", "headline=x"], "--suite-budgets headline: 'x' is not a number"),
    (["quality", "--device", "meta"], "--device: 'meta'"),
    (["quality", "--users", "3", "--beam", "100000"], "--batch-size × --beam: 3 × 100000 beams is over the 65,536"),
])
def test_argument_errors(capsys, args, fragment):
    code, out, err = run_main(capsys, *args)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line(capsys):
    code, out, err = run_main(capsys, "index", "tiny", "--device", "cuda")
    assert code == 2 and out == "" and err == "error: argument --device: cuda: no CUDA device here\n"


def test_huge_tokens_are_refused_by_row_and_column(capsys, tmp_path):
    path = tmp_path / "wide.csv"
    path.write_text("item_id,s1,s2\n1,0,4294967296\n2,0,0\n")
    code, out, err = run_main(capsys, "stats", str(path))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "column 's2'" in err and "token 4294967296 exceeds the largest supported token" in err, err


def test_synth_to_unwritable_place_is_one_line(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_main(capsys, "synth", "watch-like", "--n", "10", "--out", str(blocker / "x.csv"))
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: ")


def test_synth_round_trip_all_formats(capsys, tmp_path):
    for suffix in (".csv", ".tsv", ".parquet"):
        out = tmp_path / f"s{suffix}"
        assert run_main(capsys, "synth", "search-like", "--n", "500", "--out", str(out))[0] == 0
        sizes = None if suffix == ".parquet" else (8192, 4096, 2048, 2048, 2048)
        assert np.array_equal(load_catalog(out, codebook_sizes=sizes).sids,
                              load_catalog(tmp_path / "s.csv", codebook_sizes=(8192, 4096, 2048, 2048, 2048)).sids)


def test_registrars_add_subcommands():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert list(commands) == ["index", "next", "synth", "stats", "plan", "warmup", "bench", "train-movielens",
                              "train", "quality", "bench-e2e", "serve", "decode-dataset", "coldstart",
                              "compare-orders"]
    assert len(REGISTRARS) == 12


def test_synth_catalogs_work_without_polars():
    # The GPU machine has no Polars: the package, the CLI and synth: catalogs must not need it.
    code = ("import sys; sys.modules['polars'] = None; from zerogr_core.cli import main; "
            "sys.exit(main(['stats', 'synth:watch-like:500', '--json']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["items"] == 500


def test_plan_times_every_option_and_shows_the_choice(capsys):
    code, out, err = run_main(capsys, "plan", "tiny", "--batch", "2", "--beam", "3", "--hidden", "8",
                              "--dtype", "float32", "--device", "cpu")
    assert code == 0, err
    assert "plan for batch 2, beam 3, float32, H 8 on cpu" in out and "step 3 options (µs):" in out
    code, out, err = run_main(capsys, "plan", "tiny", "--batch", "1", "--beam", "4", "--hidden", "8", "--json",
                              "--device", "cpu", "--override", "full,sparse+selective/prune,selective")
    assert code == 0, err
    plan = json.loads(out)
    assert [row["topk"] for row in plan["steps"]][1] == "prune" and plan["steps"][2]["mode"] == "sparse+selective"
    assert plan["total_us"] > 0


def test_plan_on_a_missing_gpu_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    code, out, err = run_main(capsys, "plan", "tiny", "--device", "cuda")
    assert code != 0 and err.count("\n") == 1 and "no CUDA device here" in err


def test_a_missing_optional_package_is_one_line():
    # A file catalog needs Polars; without it the CLI names the package instead of a traceback.
    code = ("import sys; sys.modules['polars'] = None; from zerogr_core.cli import main; "
            "sys.exit(main(['stats', 'sample_catalogs/tiny.csv']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "'polars'" in result.stderr


def test_plan_store_that_cannot_be_written_is_said_in_one_line(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out, err = run_main(capsys, "plan", "tiny", "--plan-dir", str(blocker / "plans"), "--batch", "1",
                              "--beam", "2", "--hidden", "4")
    assert code == 0 and "plan timed now, not saved" in out and "saved to" not in out
    assert err.startswith("warning: plan store: cannot write") and err.count("\n") == 1, err


@pytest.mark.parametrize("exc", [MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried "
                                                             "to allocate 120000000000 bytes"),
                                 RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")])
def test_running_out_of_memory_is_one_line(capsys, monkeypatch, exc):
    import zerogr_core.cli as cli

    def fail(args):
        raise exc

    monkeypatch.setattr(cli, "_run_index", fail)
    code, out, err = run_main(capsys, "index", "tiny")
    assert code == 1 and out == "" and err.startswith("error: out of memory") and err.count("\n") == 1, err
