"""The benchmark command end to end in --quick mode, its result files, and the figures.

The main run uses the kernels' PyTorch references (TRITON_INTERPRET=0) so every suite fits
in seconds on a CPU; a second, smaller run goes through the Triton interpreter. On a GPU
machine the last test runs the quick bench on CUDA, where every capturable method is
replayed from a CUDA graph.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zerogr_core.bench.methods import CAPTURABLE, METHODS
from zerogr_core.bench.results import FORMAT, load_results
from zerogr_core.bench.registry import SUITE_NAMES
from zerogr_core.bench.workload import static_from_index
from zerogr_core.catalog.synth import generate
from zerogr_core.index import INDEX_PRESETS, build_index, build_static_index

ROOT = Path(__file__).resolve().parents[1]
META = ("gpu", "driver", "torch", "triton", "seed", "command", "run_command", "catalog", "n_items", "codebooks",
        "states", "entries", "max_segments", "mean_segments")


def run_bench(*args: str, interpret: str = "0", timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET=interpret, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "zerogr_core", "bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result = run_bench("--quick", "--suite", "all", "--device", "cpu", "--json", str(out / "quick.json"),
                       "--csv", str(out / "quick.csv"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result


def test_quick_bench_writes_every_suite_with_metadata(quick_run):
    out, result = quick_run
    doc = json.loads((out / "quick.json").read_text())
    assert doc["format"] == FORMAT and doc["finished"] is True
    assert doc["run_command"].startswith("python -m zerogr_core bench --suite ")
    records = doc["records"]
    assert {r["suite"] for r in records} == set(SUITE_NAMES)
    assert not [r for r in records if r["kind"] == "error"]
    for rec in records:
        if rec["kind"] == "skipped":
            continue
        for key in META:
            assert key in rec, (key, rec["kind"], rec["suite"])
        assert rec["command"].startswith("python -m zerogr_core bench --suite " + rec["suite"])
        assert rec["states"].startswith("1/") and len(rec["max_segments"].split("/")) == rec["n_levels"]
    catalogs = [r for r in records if r["kind"] == "catalog"]
    assert catalogs and all(r["catalog_stats"][0]["step"] == 1 for r in catalogs)
    kinds = {r["kind"] for r in records}
    assert (out / "quick.jsonl").exists() and len(load_results(out / "quick.jsonl")) == len(records)
    assert {"catalog", "latency", "speedup", "plan", "check", "step", "stage", "ablation", "memory", "build", "bandwidth",
            "interference"} <= kinds
    # every method was checked valid, and zerogr equals the reference, at batch 1 and the largest batch
    checks = [r for r in records if r["kind"] == "check"]
    assert checks and all(r["passed"] for r in checks), [r for r in checks if not r["passed"]][:3]
    head = [r for r in checks if r["suite"] == "headline"]
    for method in METHODS:
        for batch in (1, 2):
            assert any(r["method"] == method and r["batch"] == batch and r["check"] == "valid-items" for r in head)
    zref = [r for r in head if r["method"] == "zerogr" and r["check"].startswith("equals")]
    assert zref and all(r["status"] == "equal" for r in zref)
    # latency: every method at every shape, eager everywhere; graph marked unavailable on a CPU
    lat = [r for r in records if r["kind"] == "latency" and r["suite"] == "headline"]
    for method in METHODS:
        eager = [r for r in lat if r["method"] == method and r["mode"] == "eager"]
        assert len(eager) == 4 and all(r["median_ms"] > 0 and r["n"] == 3 for r in eager)
        graph = [r for r in lat if r["method"] == method and r["mode"] == "graph"]
        assert all(r["status"] == "unavailable" for r in graph)
    # the per-step, per-stage and ablation reports cover every step / stage / variant
    steps = {(r["method"], r["step"]) for r in records if r["kind"] == "step"}
    assert {("zerogr", s) for s in range(1, 6)} <= steps and ("band-gemm", 2) in steps
    # what float32 logits cost the band GEMM: beside it, the GEMM that rounds to the head dtype (fp16 here)
    assert ("band-gemm-head-dtype-out", 2) in steps
    stages = {r["stage"] for r in records if r["kind"] == "stage"}
    assert {"filtering+projection", "normalisation", "selection+gather", "fused step"} <= stages
    variants = {r["variant"] for r in records if r["kind"] == "ablation"}
    assert {"full projection", "naive selective", "slot-based selective"} <= variants
    memory = {r["structure"] for r in records if r["kind"] == "memory" and r["step"] == "total"}
    assert {"zerogr", "static-style", "sid-table-int16", "host-trie"} <= memory
    builds = [r for r in records if r["kind"] == "build" and r.get("identical_to_zerogr_index") is not None]
    assert builds and all(r["identical_to_zerogr_index"] for r in builds)
    conditions = {r["condition"] for r in records if r["kind"] == "interference"}
    assert {"idle", "during layout rebuild", "during host-copy rebuild"} == conditions
    # the sweeps really sweep
    assert {r["beam"] for r in records if r["suite"] == "beam-sweep" and r["kind"] == "latency"} == {2, 4}
    assert {r["codebook"] for r in records if r["suite"] == "codebook-sweep" and r["kind"] == "latency"} == {16, 32}
    # CSV: one row per record over the union of the keys; the summary is printed last
    with open(out / "quick.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(records)
    assert set(META) <= set(rows[0])
    assert "[checks]" in result.stdout.strip().splitlines()[-2] or "[checks]" in result.stdout[-2000:]


def test_a_committed_runs_csv_is_written_back_from_its_json(quick_run, tmp_path):
    """Committed runs keep the JSON only: ``python -m zerogr_core.bench.write_csv`` writes the CSV the
    run itself wrote, byte for byte; anything else is one line naming the file."""
    out, _ = quick_run
    kept = tmp_path / "quick.json"
    kept.write_text((out / "quick.json").read_text())
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "-m", "zerogr_core.bench.write_csv", str(kept)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "quick.csv").read_text() == (out / "quick.csv").read_text()
    other = tmp_path / "notes.json"
    other.write_text("{}")
    bad = subprocess.run([sys.executable, "-m", "zerogr_core.bench.write_csv", str(other)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == f"error: {other}: not a benchmark result file (a {FORMAT} .json or .jsonl)"
    # a folder: every result document under it, the other JSON left alone
    (tmp_path / "quick.csv").unlink()
    whole = subprocess.run([sys.executable, "-m", "zerogr_core.bench.write_csv", str(tmp_path)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert whole.returncode == 0, whole.stderr
    assert (tmp_path / "quick.csv").read_text() == (out / "quick.csv").read_text()
    assert not (tmp_path / "notes.csv").exists()


def test_summarize_saved_results(quick_run):
    out, _ = quick_run
    result = run_bench("--summarize", str(out))
    assert result.returncode == 0, result.stderr
    assert "[headline]" in result.stdout and "[memory]" in result.stdout and "[checks]" in result.stdout
    assert "[plans]" in result.stdout


def test_figures_from_results(quick_run, tmp_path):
    from zerogr_core.bench import figures

    out, _ = quick_run
    records = load_results(out)
    assert records and all(r["source"] == "quick.json" for r in records)
    for name in ("figure_speedup", "figure_latency", "figure_beam_sweep", "figure_codebook_sweep", "figure_steps",
                 "figure_stages", "figure_ablation", "figure_memory", "figure_build", "figure_interference"):
        fig = getattr(figures, name)(records)
        assert len(fig.data) > 0, name
        empty = getattr(figures, name)([])
        assert len(empty.data) == 0 and empty.layout.annotations, name
    rows = figures.headline_rows(records)
    assert rows and {"zerogr ms", "speedup vs static"} <= set(rows[0])
    written = figures.save_figures(records, tmp_path, png=False)
    assert len(written["html"]) == len(figures.all_figures([])) and all(Path(p).stat().st_size > 1000 for p in written["html"])



def legend_and_series(fig) -> tuple[list, set]:
    """The legend's entries (in order, repeats kept) and the names of the series drawn."""
    def drawn(t) -> bool:
        values = t.x if getattr(t, "orientation", None) == "h" else t.y
        return values is not None and any(v is not None for v in values)

    traces = [t for t in fig.data if t.type != "table"]
    legend = [t.name for t in traces if t.showlegend is not False]
    return legend, {t.name for t in traces if drawn(t)}


def test_every_legend_names_exactly_the_series_drawn_from_the_committed_results():
    """One legend entry per series drawn, none unnamed, none for an empty trace; unmeasured cells are "—"."""
    from zerogr_core.bench import figures

    records = load_results(ROOT / "runs" / "results")
    assert records
    built = figures.all_figures(records)
    assert sum(len(f.data) > 0 for f in built.values()) >= 5
    for stem, fig in built.items():
        legend, series = legend_and_series(fig)
        assert all(name for name in legend), (stem, legend)
        assert len(legend) == len(set(legend)) and set(legend) == series, (stem, legend, series)
        assert all(t.type == "table" or t.name in series for t in fig.data), stem   # no empty trace
        by_name = {}
        for t in fig.data:
            if t.type != "table":
                colour = t.marker.color if t.type == "bar" else t.line.color
                assert by_name.setdefault(t.name, colour) == colour, (stem, t.name)   # one colour per entry
        for table in (t for t in fig.data if t.type == "table"):
            assert all(v not in ("", None) for column in table.cells.values for v in column), stem


def test_a_method_missing_from_the_first_panel_is_still_in_the_legend():
    from zerogr_core.bench import figures

    def record(catalog, method, batch, ms):
        return dict(kind="latency", status="ok", suite="headline", catalog_label=catalog, dtype="fp16", hidden=64,
                    beam=8, codebook=16, batch=batch, method=method, mode="graph", median_ms=ms)

    records = [record("a", "zerogr", 1, 1.0), record("a", "static", 1, 2.0),
               record("b", "zerogr", 1, 1.0), record("b", "cpu-trie", 1, 9.0), record("b", "static", 1, 3.0)]
    for fig in (figures.figure_latency(records), figures.figure_speedup(records)):
        legend, series = legend_and_series(fig)
        assert set(legend) == series and "cpu-trie" in legend and len(legend) == len(series)
    single = figures.figure_latency(records[:1])
    assert single.layout.showlegend is True and legend_and_series(single)[0] == ["zerogr"]

def test_quick_bench_through_the_triton_interpreter(tmp_path):
    # the methods that run every Triton kernel: filtering, selective projection, normalisation, top-k
    methods = ["zerogr", "static-adapted", "naive-selective"]
    result = run_bench("--quick", "--suite", "headline", "--catalog", "watch-like", "--codebook", "16",
                       "--batch", "2", "--beam", "3", "--dtype", "fp32", "--hidden", "16", "--device", "cpu",
                       "--methods", ",".join(methods), "--out", str(tmp_path), interpret="1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = load_results(tmp_path)
    assert records[0]["run_command"].endswith("--device cpu")
    checks = [r for r in records if r["kind"] == "check"]
    assert len(checks) == 2 * len(methods) and all(r["passed"] for r in checks)


@pytest.mark.parametrize("kind,codebook", [("search-like", 24), ("watch-like", 20)])
@pytest.mark.parametrize("dense_levels", [1, 2])
def test_static_from_index_equals_the_static_builder(kind, codebook, dense_levels):
    catalog = generate(kind, 700, seed=5, codebook=codebook)
    offsets = catalog.band_offsets or (0,) * catalog.n_levels
    want = build_static_index(catalog, dense_levels=dense_levels, band_offsets=offsets)
    cpu = build_index(catalog, config=INDEX_PRESETS["all-sparse"])
    got = static_from_index(catalog, cpu, "cpu", offsets, dense_levels)
    assert (got.vocab, got.band_offsets, got.max_row) == (want.vocab, want.band_offsets, want.max_row)
    for a, b in [(got.first_mask, want.first_mask), (got.dense_mask, want.dense_mask),
                 (got.dense_states, want.dense_states), *zip(got.indptr, want.indptr), *zip(got.pairs, want.pairs)]:
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert got.nbytes == want.nbytes


def test_usage_errors_are_one_line():
    for args, fragment in ((["--suite", "nope"], "--suite"), (["--dtype", "fp16,fp32", "--hidden", "1,2,3"],
                                                               "pair them"),
                           (["--methods", "zerogr,magic"], "--methods"), (["--batch", "0"], "--batch")):
        result = run_bench("--quick", *args)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_quick_bench_on_cuda_replays_every_capturable_method(tmp_path):
    result = run_bench("--quick", "--suite", "headline,ablation,build", "--dtype", "fp32", "--batch", "2",
                       "--device", "cuda", "--out", str(tmp_path), interpret="0", timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    records = load_results(tmp_path)
    assert not [r for r in records if r["kind"] == "error"]
    assert all(r["passed"] for r in records if r["kind"] == "check")
    graph = {r["method"] for r in records if r["kind"] == "latency" and r["mode"] == "graph" and r["status"] == "ok"}
    assert graph == {m for m in METHODS if CAPTURABLE[m]}
    assert all(r["gpu"] != "none (CPU run)" and r["device"] == "cuda" for r in records if "gpu" in r)
    assert np.isfinite([r["median_ms"] for r in records if r["kind"] == "latency" and r["status"] == "ok"]).all()


def test_bench_runs_without_polars_or_plotly(tmp_path):
    # The GPU machine has torch, numpy and triton but neither Polars nor Plotly.
    code = ("import sys; sys.modules['polars'] = None; sys.modules['plotly'] = None; "
            "from zerogr_core.cli import main; "
            f"sys.exit(main(['bench', '--quick', '--suite', 'memory,build', '--out', {str(tmp_path)!r}]) or "
            f"main(['bench', '--summarize', {str(tmp_path)!r}]))")
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "[memory]" in result.stdout


def test_gpu_run_script_dry_run_packs_results(tmp_path):
    # runs/gpu_run.sh is what spends the lent GPU's time: a CPU dry run (BENCH_QUICK=1)
    # of two groups must pack their results, logs and summary into OUT
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, BENCH_QUICK="1", PYTHON=sys.executable, OUT=str(out), BENCH_WORK=str(work),
               BENCH_BUDGET_S="200", RESULTS_TAG="dry", TRITON_INTERPRET="0")
    result = subprocess.run(["bash", "runs/gpu_run.sh", "beams", "memoryless"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "unknown group 'memoryless'" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["bench_results.tar.gz", "gpu_run.log", "summary.txt"]
    names = subprocess.run(["tar", "tzf", str(out / "bench_results.tar.gz")], capture_output=True, text=True,
                           check=True).stdout.split()
    assert "results/logs/beams-dry.log" in names
    assert any(n.startswith("results/beams-dry/beam-sweep__") and n.endswith(".json") for n in names)
    assert "[beam-sweep]" in (out / "summary.txt").read_text()


def test_gpu_run_script_fails_when_a_group_fails(tmp_path):
    # an interpreter that cannot run anything: every group's command fails, and the script must say so
    env = dict(os.environ, BENCH_QUICK="1", PYTHON="false", OUT=str(tmp_path / "out"),
               BENCH_WORK=str(tmp_path / "work"), BENCH_BUDGET_S="120")
    result = subprocess.run(["bash", "runs/gpu_run.sh", "beams", "codebooks"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "failed: beams (exit 1) codebooks (exit 1)" in result.stdout


def test_projection_sweep_dry_run_checks_every_tuning_against_the_first(tmp_path):
    # zerogr_core.bench.projection_sweep wrote runs/results/projection-sweep/ on the H200; its CPU dry
    # run (tiny shapes, interpreter) must produce the same record layout, every tuning agreeing
    out = tmp_path / "sweep.json"
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "zerogr_core.bench.projection_sweep", "--out", str(out), "--dry-run",
                             "--part", "selective,full,shared", "--shapes", "b32-step4", "--dtypes", "fp32",
                             "--repeats", "2"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert {"gpu", "torch", "triton"} <= set(doc["env"])
    parts = {r["part"] for r in doc["records"]}
    assert parts == {"selective", "full", "shared"}
    assert all(r["status"] == "ok" and r["same_mask"] and r["max_abs_diff"] <= 1e-4 for r in doc["records"])
    assert {"mm", "split-k 2"} <= {r["tuning"] for r in doc["records"] if r["part"] == "full"}
    shared = [r for r in doc["records"] if r["part"] == "shared"]
    assert {"per-beam default", "g2/h64/w4"} <= {r["tuning"] for r in shared}
    assert all(r["distinct_states"] < r["n_beams"] for r in shared)   # the requests meet in states
    bad = subprocess.run([sys.executable, "-m", "zerogr_core.bench.projection_sweep", "--out", str(out), "--dry-run",
                          "--part", "selectiv"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--part: unknown value 'selectiv'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_profile_decode_quick_run_and_its_interval_arithmetic(tmp_path):
    # zerogr_core.bench.profile_decode profiled the headline shapes on the H200; on the CPU it decodes
    # a small catalog through the kernels' references (no profile) to check the script
    out = tmp_path / "profile.json"
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "zerogr_core.bench.profile_decode", "--quick", "--shapes", "fp16:1,fp32:2",
                             "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [(r["dtype"], r["batch"]) for r in doc["runs"]] == [("fp16", 1), ("fp32", 2)]
    assert all(len(r["plan"]) == 5 and r["median_ms"] > 0 for r in doc["runs"])
    bad = subprocess.run([sys.executable, "-m", "zerogr_core.bench.profile_decode", "--quick", "--shapes", "fp8:1", "--out",
                          str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--shapes: 'fp8:1' is not DTYPE:BATCH" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "zerogr_core.bench.profile_decode", "--quick", "--reps", "0", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--reps and --top must be at least 1, got 0 and 30" in bad.stderr
    assert "Traceback" not in bad.stderr
    from zerogr_core.bench.kernel_profile import union_us

    # overlapping (PDL) and disjoint kernels: busy time counts each instant once
    assert union_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert union_us([]) == 0


def test_kernel_table_splits_identical_decodes():
    from types import SimpleNamespace as NS

    from zerogr_core.bench.kernel_profile import kernel_table

    def ev(name, start, end, kind="CUDA"):
        return NS(name=name, device_type=NS(name=kind), time_range=NS(start=start, end=end), device_time=end - start)

    # two decodes of three kernels (the second overlaps the first, as under PDL), one host event
    events = [ev("a", 0, 10), ev("b", 8, 12), ev("c", 15, 20), ev("host", 0, 100, "CPU"),
              ev("a", 100, 110), ev("b", 108, 112), ev("c", 115, 21 + 100)]
    t = kernel_table(events, 2, top=2)
    assert t["kernels_per_decode"] == 3 and t["kernel_us_sum"] == 19.5
    assert (t["busy_us"], t["span_us"], t["gap_us"]) == (17.5, 20.5, 3.0)
    assert [k["name"] for k in t["kernels"]] == ["a", "c"] and t["kernels"][0]["calls"] == 1
    # the first decode idles 3 µs, between b (which ends after a) and c
    assert t["widest_gaps"] == [dict(us=3.0, after="b", before="c")]
    assert kernel_table(events[:2], 3, top=2)["note"] == "events do not split into equal decodes"


def test_idle_stretches_longest_first():
    from types import SimpleNamespace as NS

    from zerogr_core.bench.kernel_profile import idle_stretches

    def ev(name, start, end):
        return NS(name=name, time_range=NS(start=start, end=end))

    # a long kernel covers a short one: the stretch after both starts at the long one's end
    events = [ev("long", 0, 10), ev("inside", 2, 4), ev("x", 11, 12), ev("y", 17, 18), ev("z", 18, 19)]
    assert idle_stretches(events) == [dict(us=5.0, after="x", before="y"), dict(us=1.0, after="long", before="x")]
    assert idle_stretches([]) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_llm_bench_profile_call_sums_one_call():
    """The LLM bench's kernel tables: one call's kernels, and the idle time between them."""
    from zerogr_core.bench.llm import profile_call

    x = torch.randn(256, 256, device="cuda")
    t = profile_call(lambda: (x @ x).relu_().sum(), torch.device("cuda"), top=5)
    assert t["kernels_per_decode"] >= 3 and t["kernel_us_sum"] > 0 and t["kernels"]
    assert t["span_us"] >= t["busy_us"] > 0 and t["gap_us"] >= 0


def test_topk_paths_option_narrows_the_plan(tmp_path):
    result = run_bench("--quick", "--suite", "headline", "--device", "cpu", "--methods", "zerogr", "--batch", "2",
                       "--topk-paths", "small,wide", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [r for f in tmp_path.glob("*.json") for r in load_results(f)]
    plans = [r for r in records if r.get("kind") == "plan"]
    assert plans and all("--topk-paths small,wide" in r["command"] for r in plans)
    timed = {label for r in plans for row in r["plan"] for label in row if label.endswith(" (µs)")}
    assert timed and not any("prune" in label or "split" in label for label in timed)
    checks = [r for r in records if r.get("kind") == "check" and r.get("method") == "zerogr"]
    assert checks and all(r["passed"] for r in checks)
    bad = run_bench("--quick", "--suite", "headline", "--topk-paths", "small,fast")
    assert bad.returncode != 0 and "--topk-paths: unknown value 'fast'" in bad.stderr


def test_cpu_decode_orders_script_writes_its_record(tmp_path):
    """zerogr_core.app_support.cpu_decode_orders (docs/results.md's CPU figures) runs and records its command."""
    out = tmp_path / "orders.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "zerogr_core.app_support.cpu_decode_orders", "--batch", "1",
                             "--repeats", "1", "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["run_command"].startswith("python -m zerogr_core.app_support.cpu_decode_orders --batch 1")
    assert {r["batch"] for r in data["records"]} == {1}
    assert {r.get("method") for r in data["records"] if r["kind"] == "cpu-decode"} == \
        {"filter-first (CPU plan)", "filter-first (default projection)", "score-first"}


@pytest.mark.parametrize("flag, least, most", [("--batch", 1, None), ("--beam", 1, None), ("--repeats", 1, 10_000),
                                               ("--seed", 0, 2**32 - 1)])
def test_cpu_decode_orders_script_checks_its_counts_when_parsing(tmp_path, capsys, flag, least, most):
    """Its counts were plain int: --seed -1 ran to numpy's traceback after loading the model, --repeats 0 to
    statistics', --batch x to int()'s; now each is the project's argument type, one line, status 2."""
    from test_cli_arguments import _bad_values

    from zerogr_core.app_support import cpu_decode_orders

    out = ["--out", str(tmp_path / "orders.json")]  # nothing lands in runs/ should a value get through
    for value, message in _bad_values(least, most):
        assert cpu_decode_orders.main([flag, value, *out]) == 2, (flag, value)
        assert capsys.readouterr() == ("", f"error: argument {flag}: {message}\n"), (flag, value)
    assert cpu_decode_orders.main(["--batch", "1,1024", "--beam", "128", *out]) == 2
    assert capsys.readouterr().err == ("error: --batch × --beam: 1024 × 128 beams is over the 65,536 one decode may "
                                       "hold\n")


def test_the_apps_live_sweep_refuses_a_bad_count_in_one_line(tmp_path, capsys):
    # the app parses bench's arguments with its own parser: the bad value still comes back as one line
    from zerogr_core.app_support.benchrun import LiveSweep
    from zerogr_core.errors import ZeroGRError

    for argv, message in ((["--batch", "1,0"], "argument --batch: must be ≥ 1, got 0"),
                          (["--scale", "lots"], "argument --scale: 'lots' is not a whole number")):
        with pytest.raises(ZeroGRError) as caught:
            LiveSweep(argv, tmp_path)
        assert str(caught.value) == f"benchmark arguments: {message}"
    assert capsys.readouterr().err == ""
