"""The cold-start items study: its split, baselines, constrained decodes and ``coldstart`` command."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from zerogr_core.catalog import Catalog
from zerogr_core.cli import main
from zerogr_core.errors import ZeroGRError
from zerogr_core.recsys.cold_items import cold_item_set, cold_split, draw_cold_items
from zerogr_core.recsys.cold_study import KS, METHODS, random_expectation
from zerogr_core.recsys.sequences import load_sequences


def write_data(directory: Path, n_users: int = 160, n_items: int = 120, seed: int = 0) -> tuple[Path, Path]:
    """A sequence file whose next items mostly share the previous item's first SID token,
    and its content SID file (3 levels of 8, unique)."""
    rng = np.random.default_rng(seed)
    codes = rng.permutation(8 ** 3)[:n_items]
    sids = {str(i + 1): [int(c // 64), int(c // 8 % 8), int(c % 8)] for i, c in enumerate(codes)}
    by_first = {}
    for item, sid in sids.items():
        by_first.setdefault(sid[0], []).append(int(item))
    lines = []
    for u in range(n_users):
        seq = [int(rng.integers(1, n_items + 1))]
        for _ in range(int(rng.integers(3, 9))):
            same = by_first[sids[str(seq[-1])][0]]
            seq.append(int(rng.choice(same)) if rng.random() < 0.8 else int(rng.integers(1, n_items + 1)))
        lines.append(f"u{u} " + " ".join(map(str, seq)))
    (directory / "seq.txt").write_text("\n".join(lines) + "\n")
    (directory / "sids.json").write_text(json.dumps(sids))
    return directory / "seq.txt", directory / "sids.json"


# ---------------------------------------------------------------------------- split
@pytest.mark.parametrize("share", [0.02, 0.05, 0.2])
def test_split_holds_cold_items_out_of_training_and_tests_only_cold_targets(tmp_path, share):
    seq, sids = write_data(tmp_path)
    data = load_sequences(seq, sids)
    split = cold_split(data, share, seed=3)
    cold = set(split.cold_items.tolist())
    assert split.cold_items.size == max(1, round(share * data.n_items))
    assert not cold & set(split.warm.items.tolist())
    assert split.warm.n_items == data.n_items and (split.warm.item_ids == data.item_ids).all()
    assert split.removed_interactions == int(np.isin(data.items, split.cold_items).sum())
    # Each kept user's warm sequence is its full sequence without the cold items, in order.
    by_user = {u: data.sequence(r) for r, u in enumerate(data.user_ids)}
    for r, user in enumerate(split.warm.user_ids):
        full = by_user[user]
        assert split.warm.sequence(r).tolist() == [i for i in full.tolist() if i not in cold]
    expected = []
    for r in range(data.n_users):
        s = data.sequence(r)
        if int(s[-1]) in cold and any(int(i) not in cold for i in s[:-1]):
            expected.append(r)
    assert split.test_users.tolist() == expected
    for r, hist, target in zip(split.test_users, split.test_histories, split.test_targets):
        s = data.sequence(int(r))
        assert int(target) == int(s[-1]) and int(target) in cold
        assert hist.tolist() == [i for i in s[:-1].tolist() if i not in cold]


def test_split_is_seeded_and_recorded(tmp_path):
    seq, sids = write_data(tmp_path)
    data = load_sequences(seq, sids)
    a, b, c = cold_split(data, 0.2, 1), cold_split(data, 0.2, 1), cold_split(data, 0.2, 2)
    assert a.cold_items.tolist() == b.cold_items.tolist() != c.cold_items.tolist()
    record = a.record()
    assert record["cold_item_ids"] == data.item_ids[a.cold_items].tolist()
    assert record["n_cold"] == a.cold_items.size and record["share"] == 0.2 and record["seed"] == 1
    assert record["cold_sha256"] == b.digest() != c.digest()
    json.dumps(record)


@pytest.mark.parametrize("share", [0, 1, 1.5, -0.1, "x"])
def test_a_bad_share_is_refused(share):
    with pytest.raises(ZeroGRError, match="--cold"):
        draw_cold_items(np.arange(100), share, 0)


def test_a_share_that_leaves_nothing_to_train_on_is_refused_naming_cold(tmp_path, capsys):
    """At 0.95 two users keep three warm items each, one training item apiece after leave-one-out, so no
    training example: the command failed in training with 'training data: no user has two or more training
    interactions', naming no argument."""
    seq, sids = write_data(tmp_path, n_users=80, n_items=60)
    split = cold_split(load_sequences(seq, sids), 0.9, 0)
    assert (np.diff(split.warm.offsets) > 3).any()                   # 0.9 still trains
    with pytest.raises(ZeroGRError, match=r"^--cold 0.95: no user keeps 4 or more warm interactions"):
        cold_split(load_sequences(seq, sids), 0.95, 0)
    assert main(["coldstart", "--data", str(seq), "--sids", str(sids), "--cold", "0.95", "--preset", "tiny",
                 "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --cold 0.95: no user keeps") and "lower --cold" in err and err.count("\n") == 1


def test_cold_item_set_of_a_catalog_matches_the_study_draw():
    sids = np.array([[a, b] for a in range(4) for b in range(5)])
    ids = np.arange(100, 120)
    catalog = Catalog.from_sids(sids, [4, 5], item_ids=ids)
    got = cold_item_set(catalog, 0.25, seed=7)
    assert got.tolist() == draw_cold_items(ids, 0.25, 7).tolist() and got.size == 5
    assert set(got.tolist()) <= set(ids.tolist())
    named = Catalog.from_sids(sids, [4, 5], item_ids=[f"i{k}" for k in range(20)])
    strings = cold_item_set(named, 0.25, seed=7)
    assert strings.size == 5 and set(strings.tolist()) <= set(named.item_ids.tolist())
    assert strings.tolist() == cold_item_set(named, 0.25, seed=7).tolist()


def test_random_expectation_is_the_mean_over_the_targets_rank():
    for n in (1, 3, 7, 12):
        recall, ndcg = random_expectation(n, KS)
        ranks = np.arange(1, n + 1)           # under a uniform ranking the target's rank is uniform
        for k in KS:
            assert recall[k] == pytest.approx(np.mean(ranks <= k), abs=1e-12)
            assert ndcg[k] == pytest.approx(np.mean(np.where(ranks <= k, 1 / np.log2(ranks + 1), 0)), abs=1e-12)


def test_dense_ranks_only_candidates_and_learns_from_warm_targets_only(tmp_path):
    from zerogr_core.recsys.dense_retrieval import DenseConfig, dense_rank, train_dense

    codes = np.array([[a, b] for a in range(3) for b in range(4)], dtype=np.int64)
    rows = np.array([[0, 1, 0], [2, 0, 0], [4, 5, 6]], dtype=np.int64)
    lengths = np.array([2, 1, 3])
    warm = np.arange(8)
    config = DenseConfig.preset("tiny")
    model, record = train_dense(config, codes, rows, lengths, np.array([2, 3, 7]), warm, [np.array([1, 2])],
                                np.array([3]), torch.device("cpu"), log=lambda line: None)
    assert record["best_epoch"] in (1, 2) and len(record["history"]) == 2
    lists = dense_rank(model, [np.array([0, 1]), np.array([5])], np.array([9, 10, 11]), 5)
    assert lists.shape == (2, 5) and (lists[:, 3:] == -1).all()
    assert all(sorted(row[:3].tolist()) == [9, 10, 11] for row in lists)
    with pytest.raises(ZeroGRError, match="not among the warm items"):
        train_dense(config, codes, rows, lengths, np.array([2, 3, 9]), warm, [np.array([1])], np.array([3]),
                    torch.device("cpu"), log=lambda line: None)


# ---------------------------------------------------------------------------- the study
@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One tiny run of the whole study through the CLI, its checkpoint kept."""
    tmp = tmp_path_factory.mktemp("cold")
    seq, sids = write_data(tmp, n_users=80, n_items=60)
    out, results = tmp / "model.pt", tmp / "report.json"
    # the study's decodes take the kernels' PyTorch references, as a CPU deployment does (a
    # module-scoped fixture runs before the reference_kernels marker's per-test switch), on one
    # thread: tiny matrix products on threads that share two cores with the suite's workers crawl
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "0")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            code = main(["coldstart", "--data", str(seq), "--sids", str(sids), "--cold", "0.1", "--preset", "tiny",
                         "--device", "cpu", "--seed", "1", "--users", "4", "--out", str(out),
                         "--results", str(results), "--json"])
        finally:
            torch.set_num_threads(threads)
    assert code == 0
    return dict(seq=seq, sids=sids, out=out, report=json.loads(results.read_text()))


@pytest.fixture(scope="module")
def one_cold(tmp_path_factory):
    """The study with a share that rounds to no item: one item is drawn cold, the least the split makes."""
    tmp = tmp_path_factory.mktemp("one-cold")
    seq, sids = write_data(tmp, n_users=80, n_items=60)
    results, printed = tmp / "report.json", io.StringIO()
    with pytest.MonkeyPatch.context() as mp:  # as the study fixture: the references, one thread
        mp.setenv("TRITON_INTERPRET", "0")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with contextlib.redirect_stdout(printed):
                code = main(["coldstart", "--data", str(seq), "--sids", str(sids), "--cold", "1e-9", "--preset",
                             "tiny", "--device", "cpu", "--results", str(results)])
        finally:
            torch.set_num_threads(threads)
    assert code == 0
    return dict(json.loads(results.read_text()), printed=printed.getvalue())


def test_overlap_counts_only_the_places_the_cold_set_can_fill(one_cold):
    """One cold item: both orders return it alone, and overlap@5 and @10 read 0.2 and 0.1 (the four and
    nine empty places of each list counted as disagreement); now the share of min(K, 1) places, 1.0."""
    from zerogr_core.recsys.quality import overlap_metrics

    assert one_cold["n_cold_items"] == 1
    assert one_cold["recall"]["filter-first"]["1"] == one_cold["recall"]["score-first"]["1"] == 1.0
    assert one_cold["overlap"] == {"1": 1.0, "5": 1.0, "10": 1.0}
    diagnostic = one_cold["filter_first_catalog_normalised"]
    assert diagnostic["overlap_with_score_first"] == diagnostic["overlap_with_filter_first"] == one_cold["overlap"]
    a, b = np.array([[7, 3, -1, -1], [7, 2, -1, -1]]), np.array([[3, 7, -1, -1], [7, 3, -1, -1]])
    assert overlap_metrics(a, b, [1, 4], most=2)[0] == {1: 0.5, 4: 0.75}
    assert overlap_metrics(a, b, [1, 4])[0] == {1: 0.5, 4: 0.375}    # no limit: out of K places


def test_the_report_gives_the_share_drawn_beside_the_share_asked(one_cold):
    """--cold 1e-9 of 60 items draws one item (at least one is drawn): the log said '1 of 60 (1e-09, …)',
    the report '1 cold (1e-07 % of 60)' and the table '| 1e-07 % |'; now each gives the 1.67 % drawn."""
    from zerogr_core.recsys.cold_study import format_cold_report, markdown_table

    assert one_cold["cold_share"] == 1e-9 and one_cold["cold_share_drawn"] == pytest.approx(1 / 60)
    assert "cold-start items: 1 of 60 (1.67 %; --cold 1e-09, seed 0); " in one_cold["printed"]
    assert "cold-start items: 1 cold (1.67 % of 60), " in one_cold["printed"]
    assert format_cold_report(one_cold).startswith("cold-start items: 1 cold (1.67 % of 60), ")
    assert markdown_table([one_cold]).splitlines()[2].startswith("| 1.67 % | ")


def test_report_schema(study, capsys):
    report = study["report"]
    assert report["cold_share"] == 0.1 and report["n_cold_items"] == 6
    assert report["n_cold_test"] == min(4, report["split"]["n_cold_test"]) > 0
    for metric in ("recall", "ndcg"):
        assert list(report[metric]) == list(METHODS)
        for method in METHODS:
            values = report[metric][method]
            assert list(values) == ["1", "5", "10"] and all(0.0 <= v <= 1.0 for v in values.values())
            assert values["1"] <= values["5"] <= values["10"]
    assert list(report["overlap"]) == ["1", "5", "10"] and all(0 <= v <= 1 for v in report["overlap"].values())
    recall, ndcg = random_expectation(6, KS)
    assert report["recall"]["random"] == {str(k): recall[k] for k in KS}
    assert report["ndcg"]["random"]["10"] == pytest.approx(ndcg[10])
    diagnostic = report["filter_first_catalog_normalised"]
    for key in ("recall", "ndcg", "overlap_with_score_first", "overlap_with_filter_first"):
        assert list(diagnostic[key]) == ["1", "5", "10"]
    from zerogr_core.recsys.cold_study import markdown_table

    rows = markdown_table([report]).splitlines()
    assert len(rows) == 2 + len(METHODS) + 1 and rows[2].startswith("| 10 % | ") and "| unconstrained |" in rows[2]
    assert report["sid_source"]["file"] == "sids.json"
    assert set(report["targets"]) >= {"unconstrained_zero", "beats_random_5x", "beats_dense", "orders_gap_ok"}


def test_checkpoint_records_the_split_and_constrained_orders_return_only_cold_items(study):
    from zerogr_core.recsys.quality import decode_rows
    from zerogr_core.recsys.seqrec import load_sequence_checkpoint, rows_for

    data = load_sequences(study["seq"], study["sids"])
    split = cold_split(data, 0.1, 1)
    model = load_sequence_checkpoint(study["out"], device="cpu")
    recorded = model.meta["split"]
    assert recorded["cold_item_ids"] == split.cold_item_ids().tolist() and recorded["seed"] == 1
    row_of_item = rows_for(model, split.warm, study["out"])       # trained on the warm data, nothing else
    cold_rows = row_of_item[split.cold_items]
    histories = [row_of_item[h] for h in split.test_histories[:3]]
    for order, normalise in (("filter-first", "request"), ("filter-first", "catalog"), ("score-first", "request")):
        lists = decode_rows(model, histories, order, 10, 4, allow_rows=cold_rows, allow_normalise=normalise)
        assert lists.shape == (3, 10)
        for row in lists:
            kept = row[row >= 0]
            assert kept.size == min(10, cold_rows.size) and set(kept.tolist()) <= set(cold_rows.tolist())
            assert np.unique(kept).size == kept.size
    with pytest.raises(ZeroGRError, match="not both"):
        decode_rows(model, histories, "filter-first", 10, 4, allow_rows=cold_rows, skip_seen=True)


@pytest.mark.reference_kernels
def test_a_kept_checkpoint_is_evaluated_again_only_on_its_own_split(study, tmp_path, capsys):
    args = ["coldstart", "--data", str(study["seq"]), "--sids", str(study["sids"]), "--cold", "0.1", "--preset",
            "tiny", "--device", "cpu", "--users", "4", "--checkpoint", str(study["out"]), "--json"]
    assert main(args + ["--seed", "1"]) == 0
    again = json.loads(capsys.readouterr().out)
    for order in ("filter-first", "score-first", "unconstrained"):
        assert again["recall"][order] == study["report"]["recall"][order]
    assert again["overlap"] == study["report"]["overlap"]
    assert main(args + ["--seed", "2"]) == 1
    err = capsys.readouterr().err
    assert "trained on another split" in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("extra, message", [
    (["--sids", None], "--sids FILE is required"),
    (["--cold", "0"], "--cold must be a share of the catalog in (0, 1)"),
    (["--cold", "1.5"], "--cold must be a share of the catalog in (0, 1)"),
    (["--data", "missing.txt"], "missing.txt: interactions file not found"),
    (["--results", "r.txt"], "the report is written as .json"),
    (["--out", "a.pt", "--checkpoint", "b.pt"], "--out and --checkpoint exclude each other"),
    # a directory, or a path under a file, failed only after training: torch.save's traceback, or "[Errno 17]"
    (["--out", "/"], "--out /: is a directory; give a file name"),
    (["--results", "/dev/null/r.json"], "--results /dev/null/r.json: /dev/null is a file, not a directory"),
    (["--users", "0"], "argument --users: must be ≥ 1, got 0"),
    # numpy's legacy seeding took no more than 2**32 - 1: a larger seed trained, then raised a traceback
    (["--seed", "4294967296"], "argument --seed: must be in 0…4294967295, got 4294967296"),
    (["--preset", "tiny", "--device", "cuda:0"], "cuda"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, extra, message):
    seq, sids = write_data(tmp_path, n_users=20, n_items=30)
    args = {"--data": str(seq), "--sids": str(sids), "--cold": "0.1", "--preset": "tiny"}
    flags = []
    for i in range(0, len(extra), 2):
        key, value = extra[i], extra[i + 1]
        if key in args and value is None:
            del args[key]
        elif key in args:
            args[key] = value if key != "--data" else str(tmp_path / value)
        else:
            flags += [key, value]
    argv = ["coldstart"] + [x for kv in args.items() for x in kv] + flags
    if torch.cuda.is_available() and "cuda:0" in argv:
        pytest.skip("CUDA is available here")
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_bad_checkpoint_is_reported_before_the_data_is_read(tmp_path, capsys, monkeypatch):
    """coldstart loaded and split the data (seconds on Amazon Beauty) before it found --checkpoint missing."""
    from zerogr_core.recsys import cold_items, sequences

    seq, sids = write_data(tmp_path, n_users=20, n_items=30)

    def not_yet(*args, **kwargs):
        raise AssertionError("the data was read before --checkpoint")

    monkeypatch.setattr(sequences, "load_sequences", not_yet)
    monkeypatch.setattr(cold_items, "cold_split", not_yet)
    missing = tmp_path / "missing.pt"
    code = main(["coldstart", "--data", str(seq), "--sids", str(sids), "--cold", "0.1", "--preset", "tiny",
                 "--device", "cpu", "--checkpoint", str(missing)])
    err = capsys.readouterr().err
    assert code == 1 and err == f"error: --checkpoint {missing}: checkpoint not found\n", err
