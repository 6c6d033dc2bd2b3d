"""``python -m zerogr_core``: each subcommand end to end, and one-line errors without tracebacks."""
from __future__ import annotations

import json
import subprocess
import sys
import types
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


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    # `python -m zerogr_core stats tiny | head -0`: the pipe is closed before the command writes
    proc = subprocess.Popen([sys.executable, "-m", "zerogr_core", "stats", "tiny"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and err == "", err


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


#: Every command's help and a usage error of each, in one process; prints the heavy modules loaded.
HELP_AND_USAGE_ERRORS = """
import contextlib, io, sys
from zerogr_core.cli import build_parser, main

commands = list(build_parser()._subparsers._group_actions[0].choices)
lines = [["--help"], [], ["frobnicate"], ["plan", "tiny", "--beam", "0"]]
lines += [[c, "--help"] for c in commands] + [[c, "--no-such-option"] for c in commands]
# usage errors a handler finds (names, lists, counts checked against torch-free constants), with their messages
lines += [list(argv) for argv in HANDLER_ERRORS]
heavy, first = ("torch", "triton", "zerogr_kernels"), None
for argv in lines:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    assert code == (0 if "--help" in argv else 2), (argv, code, err.getvalue())
    message = HANDLER_ERRORS.get(tuple(argv))
    assert message is None or err.getvalue() == f"error: {message}\\n", (argv, err.getvalue())
    if first is None and any(m in sys.modules for m in heavy):
        first = argv
if first is not None:
    print(" ".join(m for m in heavy if m in sys.modules), "(first by", " ".join(first) + ")")
"""

#: Usage errors found in handlers, before they import torch (index --builders, bench --suite, --batch × --beam, …).
HANDLER_ERRORS = dict([
    (("index", "tiny", "--builders", "magic"), "--builders: unknown builder 'magic'; choose from layout, host-copy, "
                                               "serial"),
    (("index", "tiny", "--builders", ","), "--builders: name at least one builder"),
    (("index", "tiny", "--dense-steps", "2", "--sparse-steps", "2"), "step 2 is in both --dense-steps and "
                                                                     "--sparse-steps"),
    (("index", "tiny", "--dense-steps", "9"), "--dense-steps: step 9 is outside 1…3"),
    (("next", "tiny", "--prefix", "1,2,3"), "--prefix has 3 tokens; a prefix of this catalog has at most 2"),
    (("plan", "tiny", "--batch", "1024", "--beam", "128"), "--batch × --beam: 1024 × 128 beams is over the 65,536 "
                                                           "one decode may hold"),
    # plan said 'error: dtype must be one of …', naming no argument, with exit status 1
    (("plan", "tiny", "--dtype", "fp8"), "--dtype: dtype must be one of float32, bfloat16, float16, got 'fp8' (or "
                                         "fp32, bf16, fp16)"),
    (("warmup", "tiny", "--batch", "1,1024", "--beam", "128"), "--batch × --beam: 1024 × 128 beams is over the "
                                                               "65,536 one decode may hold"),
    (("warmup", "tiny", "--dtype", "fp8"), "--dtype: dtype must be one of float32, bfloat16, float16, got 'fp8' (or "
                                           "fp32, bf16, fp16)"),
    (("warmup", "tiny", "--dtype", ","), "--dtype: give at least one dtype"),
    (("warmup", "tiny", "--hidden", "64,128"), "--hidden: give one size, or one per dtype (1), got 2"),
    (("warmup", "tiny", "--no-plan-store"), "warmup writes the plan store: drop --no-plan-store"),
    (("bench", "--suite", "nosuch"), "--suite: unknown value 'nosuch'; choose from headline, beam-sweep, "
                                     "codebook-sweep, steps, stages, ablation, memory, build, interference, coldstart, "
                                     "constraints, live"),
    (("bench", "--methods", "zerogr,nosuch"), "--methods: unknown value 'nosuch'; choose from zerogr, static, "
                                              "static-adapted, unconstrained, cpu-trie, naive-selective"),
    (("bench", "--dtype", "fp8"), "--dtype: unknown value 'fp8'; choose from fp16, bf16, fp32"),
    (("bench", "--batch", "1024", "--beam", "128"), "--batch × --beam: 1024 × 128 beams is over the 65,536 one "
                                                    "decode may hold"),
    (("bench", "--suite-budgets", "nosuch=3"), "--suite-budgets: unknown suite 'nosuch'"),
    (("bench", "--dtype", "fp16,fp32", "--hidden", "1,2,3"), "--dtype lists 2 values and --hidden 3; pair them one "
                                                             "to one"),
    (("compare-orders", "--model", "x", "--batch", "1024", "--beam", "128"), "--batch × --beam: 1024 × 128 beams is "
                                                                             "over the 65,536 one decode may hold"),
    (("compare-orders", "--model", "x"), "--catalog: required with --model (the catalog the model's SIDs come from)"),
    (("compare-orders", "--checkpoint", "x.pt", "--offsets", "1,2"), "--offsets: goes with --model (a project "
                                                                     "checkpoint knows its SID tokens)"),
    (("quality", "--batch-size", "1024", "--beam", "128"), "--batch-size × --beam: 1024 × 128 beams is over the "
                                                           "65,536 one decode may hold"),
    (("decode-dataset", "--out", "x.jsonl", "--batch-sizes", "1,2"), "--batch-sizes: decode-dataset plans one batch "
                                                                     "size; give one"),    # these exited 1 after torch had loaded
    (("train", "--out", "x.pt"), "give exactly one of --data PATH or --dataset NAME"),
    (("train", "--out", "x.pt", "--data", "x.json", "--dataset", "amazon-beauty"), "give exactly one of --data PATH "
                                                                                   "or --dataset NAME"),
    (("quality", "--data", "pyproject.toml"), "--checkpoint FILE is required with --data (the bundled model belongs "
                                              "to --dataset)"),
    (("quality", "--data", "x", "--dataset", "amazon-beauty"), "give exactly one of --data PATH or --dataset NAME"),
    (("train-movielens", "--data", "x"), "--out FILE is required with --data (the bundled checkpoint belongs to the "
                                         "bundled data)"),
    (("coldstart", "--data", "x.json"), "--sids FILE is required: the cold-start study needs content semantic IDs "
                                        "(e.g. index_rqkmeans.json, from item text); SIDs built from the interactions "
                                        "it evaluates on would carry the cold items' interactions"),
    (("coldstart", "--sids", "s.json"), "--data FILE is required (a JSON {user: [items]} or 'user item item ...' "
                                        "sequence file)"),
    (("coldstart", "--data", "x.json", "--sids", "s.json", "--out", "a.pt", "--checkpoint", "b.pt"),
     "--out and --checkpoint exclude each other (--checkpoint skips training)"),
])


def test_help_and_usage_errors_load_neither_torch_nor_triton():
    # `--help` and a mistyped command line answer at once: loading torch takes over a second,
    # so the parser is built from torch-free modules and each command imports its work when it runs
    script = f"HANDLER_ERRORS = {HANDLER_ERRORS!r}\n{HELP_AND_USAGE_ERRORS}"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"loaded by help or a usage error: {result.stdout.strip()}"


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
    assert code == 2 and err == "error: argument --codebook-sizes: 'z' is not a whole number\n"


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
    (["synth", "watch-like", "--n", "10", "--out", "no_such_folder/x.csv"], "no_such_folder/x.csv: the folder "),
    (["stats", "synth:search-like"], "expected synth:KIND:N"),
    (["stats", "missing.parquet"], "missing.parquet: no such file"),
    (["plan", "tiny", "--beam", "0"], "argument --beam: must be ≥ 1, got 0"),
    (["plan", "tiny", "--dtype", "fp8"], "--dtype: dtype must be one of"),
    (["plan", "tiny", "--override", "full,full"], "error: --override: 2 steps for a catalog of 3 levels"),
    (["plan", "tiny", "--override", "full,sparse+full/fast,full"], "error: --override: step option must look like"),
    (["plan", "tiny", "--override", "sparse+full/prune,full,full"], "error: --override: step 1: option "
                                                                   "sparse+full / prune is not available"),
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
    (["train", "--out", "x.pt", "--lr", "-1"], "argument --lr: must be a positive number, got -1"),
    (["train", "--out", "x.pt", "--lr", "inf"], "argument --lr: must be a positive number, got inf"),
    (["train", "--out", "x.pt", "--validity-weight", "nan"], "argument --validity-weight: must be ≥ 0, got nan"),
    (["train", "--out", "x.pt", "--max-minutes", "0"],
     "argument --max-minutes: must be a positive number of minutes, got 0"),
    (["coldstart", "--max-minutes", "x"], "argument --max-minutes: 'x' is not a number of minutes"),
    (["quality", "--users", "3", "--beam", "100000"], "--batch-size × --beam: 3 × 100000 beams is over the 65,536"),
    (["plan", "tiny", "--hidden", "1e7"], "argument --hidden: must be in 1…65536, got 10000000"),
    (["stats", "synth:search-like:3e10"], "SIDs need about"),
    (["plan", "tiny", "--batch", "100000"], "--batch × --beam: 100000 × 128 beams is over the 65,536 one decode"),
    (["warmup", "tiny", "--batch", "1,1000", "--beam", "8,128"], "--batch × --beam: 1000 × 128 beams is over"),
    (["bench", "--quick", "--batch", "1024", "--beam", "128"], "--batch × --beam: 1024 × 128 beams is over"),
    (["bench-e2e", "--quick", "--batch", "1024", "--beam", "128"], "--batch × --beam: 1024 × 128 beams"),
])
def test_argument_errors(capsys, args, fragment):
    code, out, err = run_main(capsys, *args)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err


#: command → its arguments (besides --checkpoint) and the checkpoint format its loader takes.
CHECKPOINT_COMMANDS = {
    "quality": (["quality"], "movielens"),
    "quality --data": (["quality", "--data", "{seq}", "--sids", "{sids}"], "sequence"),
    "coldstart": (["coldstart", "--data", "{seq}", "--sids", "{sids}", "--cold", "0.1", "--preset", "tiny",
                   "--device", "cpu"], "sequence"),
    "decode-dataset": (["decode-dataset", "--input", "{input}", "--out", "{out}", "--preset", "cpu"], "sequence"),
    "serve": (["serve", "--preset", "cpu"], "sequence"),
    # compare-orders said 'error: --checkpoint: x.pt: …' with exit status 2, through a loader of its own
    "compare-orders": (["compare-orders", "--batch", "1", "--beam", "2", "--repeats", "2"], "sequence"),
}


@pytest.mark.parametrize("command", list(CHECKPOINT_COMMANDS))
@pytest.mark.parametrize("bad", ["missing", "not torch", "no weights"])
def test_a_bad_checkpoint_is_one_line_naming_the_flag_and_the_file(capsys, tmp_path, command, bad):
    """quality and coldstart named the file only ('x.pt: checkpoint not found'), and a file of the right
    format without its weights raised KeyError: 'state_dict' with a traceback (also in serve and
    decode-dataset); now each is 'error: --checkpoint x.pt: …'."""
    from test_cold_items import write_data

    from zerogr_core.recsys import seqrec, train

    seq, sids = write_data(tmp_path, n_users=80, n_items=60)
    (tmp_path / "in.jsonl").write_text('{"user": 1, "history": [1, 2]}\n')
    base, kind = CHECKPOINT_COMMANDS[command]
    path = tmp_path / "x.pt"
    if bad == "not torch":
        path.write_bytes(b"not a checkpoint")
    elif bad == "no weights":
        torch.save({"format": train.CHECKPOINT_FORMAT if kind == "movielens" else seqrec.CHECKPOINT_FORMAT}, path)
    argv = [a.format(seq=seq, sids=sids, input=tmp_path / "in.jsonl", out=tmp_path / "out.jsonl") for a in base]
    code, out, err = run_main(capsys, *argv, "--checkpoint", str(path), "--results", str(tmp_path)) \
        if command.startswith("quality") else run_main(capsys, *argv, "--checkpoint", str(path))
    assert code == 1 and err.startswith(f"error: --checkpoint {path}: ") and err.count("\n") == 1, err
    assert {"missing": "checkpoint not found", "not torch": "not a readable checkpoint",
            "no weights": "does not fit this version"}[bad] in err


@pytest.mark.parametrize("command", ["quality", "coldstart"])
def test_a_checkpoint_of_other_data_names_the_flags(capsys, tmp_path, monkeypatch, command):
    """The data and the checkpoint were named by their folder and file only ('seq.txt: fingerprint … differs
    from checkpoint x.pt's …'), not by the arguments that gave them."""
    from test_cold_items import write_data

    from zerogr_core.recsys import seqrec
    from zerogr_core.recsys.cold_items import cold_split
    from zerogr_core.recsys.sequences import load_sequences

    seq, sids = write_data(tmp_path, n_users=80, n_items=60)
    split = cold_split(load_sequences(seq, sids), 0.1, 0).record()  # coldstart checks the split first
    other = types.SimpleNamespace(meta={"data": {"fingerprint": "0" * 16, "directory": "other.txt"}, "split": split})
    monkeypatch.setattr(seqrec, "load_sequence_checkpoint", lambda path, device=None: other)
    path = tmp_path / "x.pt"
    path.write_bytes(b"")
    argv = ["--data", str(seq), "--sids", str(sids), "--checkpoint", str(path)]
    argv += ["--results", str(tmp_path)] if command == "quality" else ["--cold", "0.1", "--preset", "tiny"]
    code, out, err = run_main(capsys, command, *argv)
    assert code == 1 and err.startswith(f"error: --data {seq}: fingerprint ") and err.count("\n") == 1, err
    assert f" differs from --checkpoint {path}'s 0000000000000000 (other.txt); the model was trained on other " \
           "data" in err, err


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
