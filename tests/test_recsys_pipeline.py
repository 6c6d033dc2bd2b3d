"""The MovieLens study end to end: tiny training, decoding, metrics, CLI, shipped model."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zerogr_core import Decoder, build_index
from zerogr_core.cli import main
from zerogr_core.errors import ZeroGRError
from zerogr_core.recsys.data import leave_one_out, load_movielens
from zerogr_core.recsys.quality import InvalidMass, decode_rows, evaluate, overlap_metrics, ranking_metrics
from zerogr_core.recsys.train import BUNDLED_CHECKPOINT, load_checkpoint, train_movielens

ROOT = Path(__file__).resolve().parents[1]
GENRES = ["Comedy", "Drama", "Horror", "Sci-Fi"]


def write_synthetic_ml1m(directory: Path, users: int = 48, movies: int = 40, seed: int = 0) -> Path:
    """A small ML-1M-layout data set with four taste groups of movies."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for m in range(movies):
        group = m % 4
        lines.append(f"{m + 1}::Movie {m} of {GENRES[group]} ({1970 + 10 * group})::{GENRES[group]}\n")
    (directory / "movies.dat").write_text("".join(lines), encoding="latin-1")
    rows = []
    for u in range(users):
        group = u % 4
        pool = np.arange(group, movies, 4)
        n = int(rng.integers(6, 10))
        picks = rng.choice(pool, size=min(n, pool.size), replace=False)
        for t, m in enumerate(picks):
            rows.append(f"{u + 1}::{m + 1}::5::{1000 * u + t}\n")
    (directory / "ratings.dat").write_text("".join(rows), encoding="latin-1")
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model trained on the synthetic data set (seconds on a CPU)."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("tiny")
    data_dir = write_synthetic_ml1m(root / "ml1m")
    out = root / "model" / "tiny.pt"
    # training's validation decodes take the kernels' PyTorch references, as a CPU deployment does
    # (a module-scoped fixture runs before the reference_kernels marker's per-test switch)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "0")
        meta = train_movielens(data_dir, out, preset="tiny", device="cpu", log=lambda line: None)
    return data_dir, out, meta


def test_tiny_training_writes_checkpoint_and_catalog(tiny):
    data_dir, out, meta = tiny
    # The catalog is named after the model: it was sid_catalog.csv, which a second model in the folder overwrote.
    assert out.is_file() and (out.parent / "tiny.sid_catalog.csv").is_file()
    assert meta["data"]["layout"] == "ml-1m" and meta["catalog"]["file"] == "tiny.sid_catalog.csv"
    assert len(meta["history"]) == meta["study"]["train"]["epochs"]
    rec = meta["recorded"]["test"]
    for key in ("overlap", "recall_filter_first", "recall_score_first", "ndcg_filter_first", "ndcg_score_first",
                "recall_popularity"):
        assert set(rec[key]) == {str(k) for k in meta["recorded"]["ks"]}


def test_checkpoint_reproduces_recorded_metrics(tiny):
    data_dir, out, meta = tiny
    study = load_checkpoint(out)
    data = load_movielens(data_dir)
    split = leave_one_out(data)
    rec = meta["recorded"]
    again = evaluate(study, split, np.array(rec["users"]), "test", study.rows_of_items(data), beam=rec["beam"],
                     ks=rec["ks"], measure_invalid=False)
    assert again["top10_filter_first"] == rec["test"]["top10_filter_first"]
    for key in ("overlap", "recall_filter_first", "recall_score_first", "ndcg_filter_first", "ndcg_score_first"):
        assert again[key] == pytest.approx(rec["test"][key], abs=1e-9)


def test_both_orders_return_only_catalog_items(tiny):
    data_dir, out, _ = tiny
    study = load_checkpoint(out)
    data = load_movielens(data_dir)
    split = leave_one_out(data)
    rows = study.rows_of_items(data)
    histories = [rows[split.history(u, "test")] for u in range(0, split.n_users, 4)]
    beam = 12
    index = build_index(study.catalog)
    for order in ("filter-first", "score-first"):
        lists = decode_rows(study, histories, order, beam, batch_size=16, index=index)
        assert lists.shape == (len(histories), beam)
        assert ((lists >= 0) & (lists < study.catalog.n_items)).all()
        assert all(np.unique(row).size == beam for row in lists)      # distinct items per user
    # The raw decoder result spells the catalog SID of every returned row.
    fn = study.model.hidden_fn_for(histories[:4], study.sids)
    result = Decoder(index, study.model.head_weights(), beam, order="filter-first").decode(fn, 4)
    assert np.array_equal(result.tokens.numpy(), study.catalog.sids[result.item_rows.numpy()].astype(np.int64))


def test_hidden_fn_accepts_unfilled_beams(tiny):
    _, out, _ = tiny
    study = load_checkpoint(out)
    fn = study.model.hidden_fn_for([np.array([0, 1, 2]), np.array([3])], study.sids)
    prefixes = torch.tensor([[[0], [-1]], [[-1], [1]]])
    hidden = fn(1, prefixes)
    assert hidden.shape == (2, 2, study.model.config.head_dim) and torch.isfinite(hidden).all()
    assert fn(0, torch.empty(2, 1, 0, dtype=torch.int64)).shape == (2, 1, study.model.config.head_dim)


def test_metric_helpers():
    lists = np.array([[3, 1, 2], [0, 1, 2]])
    recall, ndcg = ranking_metrics(lists, np.array([1, 5]), [1, 2, 3])
    assert recall == {1: 0.0, 2: 0.5, 3: 0.5}
    assert ndcg[2] == pytest.approx(0.5 / np.log2(3))
    overlap, differ, order_differ = overlap_metrics(lists, np.array([[1, 3, 2], [0, 1, 4]]), [1, 2, 3])
    assert overlap == {1: 0.5, 2: 1.0, 3: pytest.approx(5 / 6)}
    assert differ == {1: 0.5, 2: 0.0, 3: 0.5} and order_differ == {1: 0.5, 2: 0.5, 3: 1.0}


def test_invalid_mass_skips_a_step_without_live_beams():
    # Every request denied its whole catalog (a user who has every item): no beam is alive after step 1,
    # and quality ended in numpy's IndexError from the quantiles of an empty array.
    mass = InvalidMass(values=[[torch.tensor([0.0, 0.5])], [torch.empty(0)]],
                       densities=[[torch.tensor([1.0, 1.0])], [torch.empty(0)]])
    rows = mass.summary()
    assert [r["step"] for r in rows] == [1] and rows[0]["beams"] == 2 and rows[0]["max"] == 0.5


@pytest.mark.reference_kernels
def test_cli_quality_on_tiny_model(tiny, tmp_path, capsys):
    data_dir, out, _ = tiny
    code = main(["quality", "--data", str(data_dir), "--checkpoint", str(out), "--beam", "10", "--users", "12",
                 "--json", "--results", str(tmp_path)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["k"] == [1, 5, 10] and report["users"] == 12
    for key in ("overlap", "recall_filter_first", "recall_score_first", "ndcg_filter_first", "ndcg_score_first",
                "recall_popularity", "share_differ"):
        assert set(report[key]) == {"1", "5", "10"}
    assert [row["step"] for row in report["invalid_mass"]] == [1, 2, 3]
    assert report["invalid_mass"][0]["beams"] == 12
    assert (tmp_path / "quality.json").is_file() and (tmp_path / "quality.html").is_file()
    for order in ("filter-first", "score-first"):  # the clock: decode and host overhead apart
        parts = [report["timing"][f"{order}_{p}"] for p in ("first_call_s", "decode_s", "overhead_s")]
        assert all(p >= 0 for p in parts) and sum(parts) <= report["timing"][f"{order}_s"] + 1e-6
    from zerogr_core.recsys.commands import format_report

    assert "clock (s): filter-first decode " in format_report(report)


def test_cli_errors_are_one_line(tiny, tmp_path, capsys):
    _, out, _ = tiny
    other = write_synthetic_ml1m(tmp_path / "other", seed=1)
    assert main(["quality", "--data", str(other), "--checkpoint", str(out), "--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--data" in err and err.count("\n") == 1
    assert main(["quality", "--checkpoint", str(tmp_path / "none.pt")]) == 1
    assert "checkpoint not found" in capsys.readouterr().err
    assert main(["train-movielens", "--data", str(other)]) == 2  # a usage error
    assert "--out FILE is required with --data" in capsys.readouterr().err
    with pytest.raises(ZeroGRError, match="--beam 4"):
        study = load_checkpoint(out)
        data = load_movielens(tiny[0])
        evaluate(study, leave_one_out(data), np.arange(2), "test", study.rows_of_items(data), beam=4)


def test_shipped_checkpoint_reproduces_recorded_metrics():
    """The bundled model, re-evaluated on its recorded fixed users (fresh process, reference kernels)."""
    meta = load_checkpoint(BUNDLED_CHECKPOINT).meta
    rec = meta["recorded"]
    script = (
        "import json, numpy as np, torch; torch.set_num_threads(2)\n"
        "from zerogr_core.recsys.data import load_movielens, leave_one_out\n"
        "from zerogr_core.recsys.train import load_checkpoint\n"
        "from zerogr_core.recsys.quality import evaluate\n"
        "s = load_checkpoint(); d = load_movielens(); sp = leave_one_out(d); r = s.meta['recorded']\n"
        "out = evaluate(s, sp, np.array(r['users']), 'test', s.rows_of_items(d), beam=r['beam'], ks=r['ks'],"
        " measure_invalid=False)\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    again = json.loads(done.stdout)
    assert len(rec["users"]) == 32 and rec["beam"] == 128
    assert again["top10_filter_first"] == rec["test"]["top10_filter_first"]
    for key in ("overlap", "recall_filter_first", "recall_score_first", "ndcg_filter_first", "ndcg_score_first",
                "recall_popularity"):
        assert again[key] == pytest.approx(rec["test"][key], abs=1e-9)


@pytest.mark.reference_kernels
def test_padded_batches_decode_as_one_and_the_clock_splits(tiny):
    data_dir, out, _ = tiny
    study = load_checkpoint(out)
    data = load_movielens(data_dir)
    split = leave_one_out(data)
    rows = study.rows_of_items(data)
    histories = [rows[split.history(u, "test")] for u in range(10)]
    index = build_index(study.catalog)
    for order in ("filter-first", "score-first"):
        clock = {}
        # 10 users in batches of 4: the last batch is padded to 4, its padding dropped
        padded = decode_rows(study, histories, order, 8, batch_size=4, index=index, skip_seen=True, clock=clock)
        whole = decode_rows(study, histories, order, 8, batch_size=10, index=index, skip_seen=True)
        assert np.array_equal(padded, whole)
        assert clock["batches"] == 3 and all(clock[k] >= 0 for k in ("first_call_s", "decode_s", "overhead_s"))
        assert not any(np.isin(padded[u], histories[u]).any() for u in range(10))


def test_staged_requests_match_a_closure_per_batch(tiny):
    _, out, _ = tiny
    study = load_checkpoint(out)
    g = np.random.default_rng(0)
    histories = [g.integers(0, study.catalog.n_items, g.integers(1, 30)) for _ in range(5)]
    staged = study.model.staged(5, study.sids)
    staged.load(histories)
    fn = study.model.hidden_fn_for(histories, study.sids)
    prefixes = torch.tensor(study.catalog.sids[:15, :2].astype(np.int64)).reshape(5, 3, 2)
    for step in (0, 2):
        p = prefixes[:, :1, :0] if step == 0 else prefixes
        torch.testing.assert_close(staged(step, p), fn(step, p), rtol=1e-4, atol=1e-5)
    with pytest.raises(ZeroGRError, match="6 requests, the staged batch is 5"):
        staged.load(histories + histories[:1])


def test_default_catalog_is_per_model(tmp_path):
    # Two models trained into one folder both wrote sid_catalog.csv: the second overwrote the first's catalog.
    from zerogr_core.catalog.samples import open_catalog
    from zerogr_core.recsys.train import BUNDLED_CHECKPOINT, default_catalog_path

    a, b = default_catalog_path(tmp_path / "a.pt"), default_catalog_path(tmp_path / "b.pt")
    assert a == tmp_path / "a.sid_catalog.csv" and b == tmp_path / "b.sid_catalog.csv"
    # Retraining the bundled model still writes the catalog the samples and the app open by name.
    bundled = default_catalog_path(BUNDLED_CHECKPOINT)
    assert bundled.is_file() and open_catalog("movielens").n_items == open_catalog(str(bundled)).n_items
