"""Sequence data sets (Amazon Beauty format), their SIDs, the T5 recommender and its CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zerogr_core.cli import main
from zerogr_core.errors import ZeroGRError
from zerogr_core.recsys.data import leave_one_out
from zerogr_core.recsys.semantic_ids import SIDConfig
from zerogr_core.recsys.sequences import (DATASETS, load_dataset, load_sequences, read_sid_file,
                                         sequence_semantic_ids)

ROOT = Path(__file__).resolve().parents[1]


def write_sequences(path: Path, n_users: int = 40, n_items: int = 30, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    seqs = {str(u): [int(i) for i in rng.integers(1, n_items + 1, size=int(rng.integers(3, 9)))]
            for u in range(n_users)}
    path.write_text("".join(f"{u} {' '.join(map(str, s))}\n" for u, s in seqs.items()))
    return seqs


# ---------------------------------------------------------------------------- loaders
def test_sequence_file_and_json_load_the_same_sequences(tmp_path):
    seqs = write_sequences(tmp_path / "seq.txt")
    (tmp_path / "inter.json").write_text(json.dumps(seqs, indent=2))
    a = load_sequences(tmp_path / "seq.txt")
    b = load_sequences(tmp_path / "inter.json")
    assert (a.layout, b.layout) == ("sequence-file", "json-interactions")
    assert a.fingerprint() == b.fingerprint()
    for u, (user, items) in enumerate(seqs.items()):
        assert a.user_ids[u] == user
        assert a.item_ids[a.sequence(u)].tolist() == items
    split = leave_one_out(a)
    assert split.test_items.tolist() == [a.sequence(u)[-1] for u in range(a.n_users)]
    assert split.valid_items.tolist() == [a.sequence(u)[-2] for u in range(a.n_users)]


def test_short_users_are_dropped_and_counted(tmp_path):
    (tmp_path / "s.txt").write_text("u1 1 2 3\nu2 1 2\n\nu3 4 5 6 7\n")
    data = load_sequences(tmp_path / "s.txt")
    assert data.user_ids.tolist() == ["u1", "u3"] and data.dropped_users == 1
    assert data.item_ids.tolist() == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("name, text, message", [
    ("s.txt", "1 1 2 3\n2 4 x 6\n", "s.txt:2: field 3 'x' is not a non-negative integer item id"),
    ("s.txt", "1 1 2 3\n1 4 5 6\n", "s.txt:2: user '1' already listed on line 1"),
    ("s.txt", "\n\n", "s.txt: no user lines"),
    ("i.json", '{\n "a": [1, 2, 3],\n "b": [1, 2,\n', "i.json:4: invalid JSON"),
    ("i.json", '{\n "a": [1, 2, 3],\n "b": 7\n}', "i.json:3: the items of user 'b' must be a list"),
    ("i.json", '{\n "a": [1, 2.5, 3]\n}', "i.json:2: the items of 'a' must be integer ids"),
    ("i.json", '[1, 2]', "i.json:1: expected a non-empty JSON object"),
    # ids past int64, and digits that int() refuses or reads differently, were tracebacks or silently read
    ("s.txt", "1 1 2 3\n2 4 99999999999999999999 6\n",
     "s.txt:2: field 3 '99999999999999999999' is not a non-negative integer item id"),
    ("s.txt", "1 1 \u00b2 3\n", "s.txt:1: field 3 '\u00b2' is not a non-negative integer item id"),
    ("s.txt", "1 1 \u0663 3\n", "s.txt:1: field 3 '\u0663' is not a non-negative integer item id"),
    ("i.json", '{\n "a": [1, 99999999999999999999, 3]\n}',
     "i.json:2: the items of 'a': 99999999999999999999 is not an integer id"),
    ("i.json", '{\n "a": [1, "1_000", 3]\n}', "i.json:2: the items of 'a': '1_000' is not an integer id"),
    ("i.json", '{\n "a": [1, -4, 3]\n}', "i.json:2: the items of 'a': -4 is not an integer id"),
])
def test_malformed_files_name_file_and_line(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ZeroGRError) as err:
        load_sequences(tmp_path / name)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_sid_file_errors_and_missing_items(tmp_path):
    (tmp_path / "s.txt").write_text("1 1 2 3\n2 2 3 4\n")
    (tmp_path / "sids.json").write_text('{\n "1": [0, 1],\n "2": [0, 2, 1]\n}')
    with pytest.raises(ZeroGRError, match=r"sids.json:3: the SID of item '2' has 3 tokens"):
        read_sid_file(tmp_path / "sids.json")
    # A token sizes the model's vocabulary: 10^9 asked for hundreds of GB (or, past int32, a message without the file)
    (tmp_path / "sids.json").write_text('{\n "1": [0, 1],\n "2": [0, 1000000000]\n}')
    with pytest.raises(ZeroGRError, match=r"sids.json:3: the SID of item '2' has token 1,000,000,000 at level 2, "
                                          r"over the limit of 65,536 tokens per level"):
        read_sid_file(tmp_path / "sids.json")
    (tmp_path / "sids.json").write_text(json.dumps({"1": list(range(17))}))
    with pytest.raises(ZeroGRError, match=r"sids.json:1: the SID of item '1' has 17 tokens, over the limit of 16"):
        read_sid_file(tmp_path / "sids.json")
    (tmp_path / "sids.json").write_text('{\n "1": [0, 1],\n "99999999999999999999": [0, 2]\n}')
    with pytest.raises(ZeroGRError, match=r"sids.json:3: the id of '99999999999999999999': .* is not an integer id"):
        read_sid_file(tmp_path / "sids.json")
    (tmp_path / "sids.json").write_text('{"1": [0, 1], "2": [0, 2], "3": [1, 0]}')
    with pytest.raises(ZeroGRError, match=r"sids.json: no SID for item 4 of .*s.txt"):
        load_sequences(tmp_path / "s.txt", tmp_path / "sids.json")


def test_given_sids_keep_their_codes_and_get_a_collision_level_only_when_needed(tmp_path):
    (tmp_path / "s.txt").write_text("1 1 2 3\n2 2 3 4\n3 1 4 2\n")
    (tmp_path / "u.json").write_text('{"1": [0, 1], "2": [0, 2], "3": [1, 0], "4": [1, 1], "5": [2, 2]}')
    data = load_sequences(tmp_path / "s.txt", tmp_path / "u.json")
    assert data.item_ids.tolist() == [1, 2, 3, 4, 5]   # item 5 has a SID but no interaction: still an item
    sid = sequence_semantic_ids(data, leave_one_out(data))
    assert sid.codes.tolist() == [[0, 1], [0, 2], [1, 0], [1, 1], [2, 2]]
    assert sid.catalog.codebook_sizes == (3, 3)
    (tmp_path / "d.json").write_text('{"1": [0, 1], "2": [0, 1], "3": [1, 0], "4": [0, 1]}')
    data = load_sequences(tmp_path / "s.txt", tmp_path / "d.json")
    sid = sequence_semantic_ids(data, leave_one_out(data))
    assert sid.codes.shape == (4, 3) and np.unique(sid.codes, axis=0).shape[0] == 4
    # Training parts are [1], [2], [1]: item 1 leads the group {1, 2, 4}, so it gets token 0.
    assert sid.codes[0, 2] == 0 and sorted(sid.codes[[0, 1, 3], 2].tolist()) == [0, 1, 2]


def test_built_sids_do_not_see_validation_or_test_items(tmp_path):
    seqs = write_sequences(tmp_path / "a.txt", n_users=60, n_items=25, seed=3)
    rng = np.random.default_rng(9)
    changed = {u: s[:-2] + [int(i) for i in rng.integers(1, 26, size=2)] for u, s in seqs.items()}
    (tmp_path / "b.txt").write_text("".join(f"{u} {' '.join(map(str, s))}\n" for u, s in changed.items()))
    config = SIDConfig(levels=2, codebook_size=4, collab_dim=8, kmeans_iters=10)
    a, b = load_sequences(tmp_path / "a.txt"), load_sequences(tmp_path / "b.txt")
    assume_same_items = np.array_equal(a.item_ids, b.item_ids)
    assert assume_same_items, "pick seeds whose held-out items do not change the item set"
    sid_a = sequence_semantic_ids(a, leave_one_out(a), config)
    sid_b = sequence_semantic_ids(b, leave_one_out(b), config)
    assert np.array_equal(sid_a.codes, sid_b.codes)
    assert sid_a.config.content_weight == 0.0


def test_bundled_beauty_matches_the_published_counts():
    data = load_dataset("amazon-beauty")
    assert (data.n_users, data.n_items, int(data.items.size)) == (22363, 12101, 198502)
    assert data.sid_codes.shape == (12101, 4)
    seq = load_sequences(ROOT / "sample_catalogs" / "amazon-beauty" / "Beauty.txt")
    assert (seq.n_users, seq.n_items, int(seq.items.size)) == (22363, 12101, 198502)
    for path in DATASETS["amazon-beauty"]:
        assert path.is_file()
    for licence in ("LICENCE-tiger-cf.txt", "LICENSE-ICLRec.txt", "README.md"):
        assert (ROOT / "sample_catalogs" / "amazon-beauty" / licence).is_file()


# ---------------------------------------------------------------------------- model
def test_t5_hidden_fn_equals_the_hugging_face_decoder():
    pytest.importorskip("transformers")
    from zerogr_core.recsys.t5 import T5Config, T5Recommender

    torch.manual_seed(0)
    model = T5Recommender(T5Config(encoder_layers=2, decoder_layers=2, d_model=32, n_heads=3, d_kv=8, d_ff=64,
                                   max_items=4), [5, 6, 7])
    sids = torch.stack([torch.randint(0, v, (40,)) for v in (5, 6, 7)], dim=1)
    histories = [np.array([3]), np.arange(9), np.array([5, 1, 2])]
    fn = model.hidden_fn_for(histories, sids)
    ids, mask = model.encoder_inputs(histories, sids)
    assert ids[0].tolist()[:4] == [*model.tokens(sids[3]).tolist(), 1]   # SID tokens, then EOS
    assert mask.sum(1).tolist() == [4, 13, 10]
    enc = model.t5.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    prefixes = torch.stack([torch.randint(0, v, (3, 4)) for v in (5, 6)], dim=2)
    for step in range(3):
        got = fn(step, prefixes[:, :, :step])
        dec_ids = torch.cat([torch.zeros(3, 4, 1, dtype=torch.long), model.tokens(prefixes[:, :, :step])], 2)
        ref = model.t5.decoder(input_ids=dec_ids.reshape(12, step + 1), encoder_hidden_states=enc.repeat_interleave(
            4, 0), encoder_attention_mask=mask.repeat_interleave(4, 0)).last_hidden_state[:, step]
        torch.testing.assert_close(got.reshape(12, -1), ref, atol=1e-5, rtol=1e-5)
        logits = model.t5(input_ids=ids.repeat_interleave(4, 0), attention_mask=mask.repeat_interleave(4, 0),
                          decoder_input_ids=dec_ids.reshape(12, step + 1)).logits[:, step]
        band = logits[:, model.offsets[step]:model.offsets[step] + model.codebook_sizes[step]]
        torch.testing.assert_close(got.reshape(12, -1) @ model.head_weights()[step].T, band, atol=1e-5, rtol=1e-5)


def tiny_t5():
    """A seeded 2-layer T5 recommender over a random 3-level catalog: ``(model, catalog, sids)``,
    ``sids`` the catalog's SIDs as an int64 tensor (history items are its rows)."""
    from zerogr_core import Catalog
    from zerogr_core.recsys.t5 import T5Config, T5Recommender

    torch.manual_seed(0)
    sizes = (5, 6, 7)
    model = T5Recommender(T5Config(encoder_layers=1, decoder_layers=2, d_model=32, n_heads=3, d_kv=8, d_ff=64,
                                   max_items=4), sizes)
    rng = np.random.default_rng(0)
    catalog = Catalog.from_sids(np.unique(np.stack([rng.integers(0, v, 80) for v in sizes], 1), axis=0), sizes)
    sids = torch.from_numpy(catalog.sids.astype(np.int64))
    return model, catalog, sids


def test_t5_step_model_decodes_the_same_beams_as_hidden_fn_for():
    pytest.importorskip("transformers")
    from zerogr_core import Decoder, build_index
    from zerogr_core.models import StepDecoder

    model, catalog, sids = tiny_t5()
    histories = [np.array([3]), np.arange(9), np.array([5, 1, 2])]
    index = build_index(catalog)
    for beam in (4, 40):   # 40 > |V_0| = 5: unfilled beams after step 0
        for order in ("filter-first", "score-first"):
            ref = Decoder(index, model.head_weights(), beam, order=order).decode(
                model.hidden_fn_for(histories, sids), len(histories))
            got = StepDecoder(model.step_model(), index, model.head_weights(), beam_width=beam, order=order
                              ).decode(*model.encoder_inputs(histories, sids))
            assert torch.equal(got.item_rows, ref.item_rows), (beam, order)
            torch.testing.assert_close(got.scores, ref.scores, atol=1e-5, rtol=1e-5)


def test_package_imports_without_transformers():
    script = ("import sys; sys.modules['transformers'] = None; sys.modules['polars'] = None\n"
              "import zerogr_core, zerogr_core.recsys.seqrec, zerogr_core.cli\n"
              "from zerogr_core.recsys.t5 import T5Recommender, T5Config\n"
              "from zerogr_core.errors import ZeroGRError\n"
              "try:\n    T5Recommender(T5Config(), [4, 4])\nexcept ZeroGRError as e:\n    print('ERR', e)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ERR the T5 recommender needs transformers" in done.stdout


@pytest.mark.reference_kernels
def test_train_checkpoint_and_quality_end_to_end(tmp_path, capsys):
    pytest.importorskip("transformers")
    write_sequences(tmp_path / "seq.txt", n_users=30, n_items=20, seed=1)
    out = tmp_path / "m.pt"
    assert main(["train", "--data", str(tmp_path / "seq.txt"), "--preset", "tiny", "--out", str(out)]) == 0
    blob = torch.load(out, weights_only=True)
    assert blob["format"] == "zerogr-seqrec-1" and blob["study"]["name"] == "tiny"
    assert blob["sids"].shape[0] == blob["item_ids"].shape[0] == 20 and blob["sid_source"] == "rq-kmeans"
    assert blob["selection"]["epoch"] >= 1 and len(blob["history"]) >= 1
    from zerogr_core.recsys.curves import curves_document
    text, _ = curves_document([out])
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(blob["history"]) and f"| {blob['selection']['epoch']} (kept) |" in text
    capsys.readouterr()
    code = main(["quality", "--data", str(tmp_path / "seq.txt"), "--checkpoint", str(out), "--beam", "20",
                 "--results", str(tmp_path), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["users"] == 30 and report["k"] == [1, 5, 10, 20]
    import hashlib
    assert report["checkpoint_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    for key in ("overlap", "recall_filter_first", "recall_score_first", "ndcg_filter_first", "ndcg_score_first",
                "recall_popularity"):
        assert set(report[key]) == {"1", "5", "10", "20"}
    # Filtering first only returns catalog items, so its recall is a real hit rate in [0, 1].
    assert 0.0 <= report["recall_filter_first"]["20"] <= 1.0
    assert report["overlap"]["20"] > 0 and report["invalid_mass"][0]["step"] == 1
    assert (tmp_path / "quality-seq-tiny.json").is_file()
    assert report["skip_seen"] is True
    _history_items_are_never_returned(out, tmp_path / "seq.txt")
    # Data that is not a bundled benchmark is held to the study's bars, with no accuracy floor.
    assert report["bars"]["preset"] == "study" and "recall_ok" not in report["bars"]
    # Same checkpoint, other data: refused in one line.
    write_sequences(tmp_path / "other.txt", n_users=30, n_items=20, seed=2)
    assert main(["quality", "--data", str(tmp_path / "other.txt"), "--checkpoint", str(out),
                 "--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --data {tmp_path / 'other.txt'}: ") and f"differs from --checkpoint {out}'s" in err


def _history_items_are_never_returned(checkpoint: Path, data_path: Path) -> None:
    """``skip_seen`` decodes under each history as a deny list: no history item comes back, and
    the lists equal a decode with the same items passed by id."""
    from zerogr_core import Decoder, build_index
    from zerogr_core.recsys.quality import SEEN_NORMALISE, decode_rows
    from zerogr_core.recsys.seqrec import load_data, load_sequence_checkpoint, rows_for

    study = load_sequence_checkpoint(checkpoint)
    data = load_data(data_path, None, None)
    split = leave_one_out(data)
    rows = rows_for(study, data, checkpoint)
    histories = [rows[split.history(u, "test")] for u in range(split.n_users)]
    index = build_index(study.catalog)
    for order in ("filter-first", "score-first"):
        kept = decode_rows(study, histories, order, 8, 7, index)
        skipped = decode_rows(study, histories, order, 8, 7, index, skip_seen=True)
        seen_in_kept = sum(np.isin(k[k >= 0], h).sum() for k, h in zip(kept, histories))
        assert seen_in_kept > 0, "the tiny model returns no history item: the check below would be empty"
        for u, (lst, hist) in enumerate(zip(skipped, histories)):
            assert not np.isin(lst, hist).any(), f"{order}: user {u} gets history items {np.intersect1d(lst, hist)}"
            # 20 items, at most 18 in a test history: at least two are left, and all fill the beam or pad.
            assert (lst >= 0).sum() == min(8, 20 - np.unique(hist).size)
        decoder = Decoder(index, study.model.head_weights(), 8, order=order, catalog=study.catalog)
        hidden_fn = study.model.hidden_fn_for(histories[:7], study.sids)
        by_id = decoder.decode(hidden_fn, 7, deny_items=[study.catalog.item_ids[h] for h in histories[:7]],
                               normalise=SEEN_NORMALISE)
        np.testing.assert_array_equal(by_id.item_rows.numpy(), skipped[:7])
        # the catalog's normalisation: an item returned with and without the deny list scores the same
        free = decoder.decode(hidden_fn, 7)
        common = 0
        for u in range(7):
            kept_scores = dict(zip(free.item_rows[u].tolist(), free.scores[u].tolist()))
            for row, score in zip(by_id.item_rows[u].tolist(), by_id.scores[u].tolist()):
                if row >= 0 and row in kept_scores:
                    common += 1
                    assert abs(kept_scores[row] - score) <= 1e-5, (order, u, row, kept_scores[row], score)
        assert common > 0


def _report(recall_ff, recall_sf, ndcg_ff, ndcg_sf, overlap, popularity=0.01):
    ks = [1, 10]
    per_k = lambda v: {str(k): v for k in ks}  # noqa: E731
    return dict(k=ks, recall_filter_first=per_k(recall_ff), recall_score_first=per_k(recall_sf),
                ndcg_filter_first=per_k(ndcg_ff), ndcg_score_first=per_k(ndcg_sf), overlap=per_k(overlap),
                recall_popularity=per_k(popularity))


def test_quality_bars_follow_the_data_set():
    from zerogr_core.errors import ZeroGRError
    from zerogr_core.recsys.quality import QualityBars, bars

    beauty, study = QualityBars.for_dataset("amazon-beauty"), QualityBars.for_dataset(None)
    assert (beauty.max_gap_pp, beauty.min_overlap, beauty.min_recall_at10, beauty.min_ndcg_at10) == \
        (0.3, 0.995, 0.060, 0.032)
    assert (study.max_gap_pp, study.min_overlap, study.min_recall_at10) == (0.5, 0.99, None)
    # The previous shipped Beauty figures: gaps inside both bars, overlap and accuracy below Beauty's.
    previous = _report(0.0432, 0.0435, 0.0212, 0.0213, 0.9499)
    b = bars(previous, beauty)
    assert b["preset"] == "amazon-beauty" and b["recall_gap_ok"] and b["ndcg_gap_ok"]
    assert not b["overlap_ok"] and not b["recall_ok"] and not b["ndcg_ok"] and b["beats_popularity"]
    # The committed report of the shipped model: accuracy and gaps met, overlap missed.
    report = json.loads((ROOT / "runs" / "results" / "quality-amazon-beauty-tiger.json").read_text())
    b = bars(report, beauty)
    assert b["recall_ok"] and b["ndcg_ok"] and b["recall_gap_ok"] and b["ndcg_gap_ok"] and not b["overlap_ok"]
    # The committed report predates at_k: its bars compared K = 10, which the report's format assumes.
    assert dict(report["bars"], at_k=10) == b and report["skip_seen"] is True and report["users"] == 22363
    # A 0.4-point gap passes the study's bar and fails Beauty's; 99.2 % overlap likewise.
    gapped = _report(0.065, 0.069, 0.035, 0.035, 0.992)
    assert bars(gapped, study)["recall_gap_ok"] and bars(gapped, study)["overlap_ok"]
    b = bars(gapped, beauty)
    assert not b["recall_gap_ok"] and not b["overlap_ok"] and b["recall_ok"] and b["ndcg_ok"]
    # Exactly on a floor meets it.
    assert bars(_report(0.060, 0.060, 0.032, 0.032, 0.995), beauty)["recall_ok"]
    with pytest.raises(ZeroGRError, match="unknown quality bars 'tiger'"):
        QualityBars.preset("tiger")


def test_quality_bars_line_names_the_k_it_compares():
    # --beam under 10 measures K = 1 and 5 only: the bars compared Recall@5 but the line said "Recall@10".
    from zerogr_core.recsys.commands import format_report
    from zerogr_core.recsys.quality import QualityBars, bars

    report = _report(0.05, 0.05, 0.03, 0.03, 1.0)
    report = {key: ({"1": v["1"], "5": v["10"]} if isinstance(v, dict) else v) for key, v in report.items()}
    report.update(k=[1, 5], recall_popularity_unfiltered={"1": 0.0, "5": 0.0}, share_differ={"1": 0.0, "5": 0.0},
                  ndcg_popularity={"1": 0.0, "5": 0.0}, invalid_mass=[], users=3, beam=5,
                  data=dict(layout="ml-1m"), model=dict(parameters=1), sid=dict(codebook_sizes=[4], collision_rate=0))
    report["bars"] = bars(report, QualityBars.for_dataset("amazon-beauty"))
    line = format_report(report).splitlines()[-1]
    assert report["bars"]["at_k"] == 5 and "@10" not in line
    assert "Recall@5 above popularity" in line and "Recall@5 ≥ 0.06" in line and "NDCG@5 ≥ 0.032" in line


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "none.txt"), "--out", str(tmp_path / "m.pt")]) == 1
    err = capsys.readouterr().err
    assert "none.txt: interactions file not found" in err and "Traceback" not in err
    (tmp_path / "bad.txt").write_text("1 1 2 3\n2 1 two 3\n")
    assert main(["train", "--data", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "m.pt")]) == 1
    assert "bad.txt:2: field 3 'two'" in capsys.readouterr().err
    assert main(["train", "--dataset", "amazon-beauty", "--sids", "x.json", "--out", str(tmp_path / "m.pt")]) == 1
    assert "--sids goes with --data" in capsys.readouterr().err
    # numpy's legacy seeding took no more than 2**32 - 1: a larger seed trained, then raised a traceback
    assert main(["train", "--data", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "m.pt"), "--seed",
                 "4294967296"]) != 0
    assert "argument --seed: must be in 0…4294967295" in capsys.readouterr().err
    assert main(["quality", "--data", str(tmp_path / "bad.txt")]) == 2  # a usage error, before torch loads
    assert "--checkpoint FILE is required" in capsys.readouterr().err
    write_sequences(tmp_path / "seq.txt", n_users=10, n_items=8)
    # every number is checked as the command line is parsed (status 2)
    for flag, value, message, status in (("--lr", "-0.1", "argument --lr: must be a positive number, got -0.1", 2),
                                         ("--lr", "nan", "argument --lr: must be a positive number, got nan", 2),
                                         ("--patience", "0", "argument --patience: must be ≥ 1, got 0", 2)):
        assert main(["train", "--data", str(tmp_path / "seq.txt"), "--preset", "tiny", "--out", str(tmp_path / "m.pt"),
                     flag, value]) == status
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.pt").exists()


def test_density_table_reports_step_stats():
    from zerogr_core.catalog.samples import open_catalog, tiny_catalog
    from zerogr_core.recsys.analysis import density_markdown, invalid_mass_markdown

    tiny = tiny_catalog()
    lines = density_markdown({"tiny": tiny}).splitlines()
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:3] == ["tiny", "12", "4/4/4"]
    assert cells[3:] == [f"{s['density']:.4f} ({s['mean_segment']:.1f})" for s in tiny.step_stats()]
    beauty = open_catalog("amazon-beauty")
    assert beauty.n_items == 12101 and beauty.codebook_sizes == (256, 256, 256, 256)
    rows = [dict(step=1, beams=3, mean=0.0, p90=0.0, p99=0.0, beam_density=1.0)]
    assert "| m | 1 | 3 | 0.0000 |" in invalid_mass_markdown({"m": {"invalid_mass": rows}})


def test_shipped_beauty_checkpoints_and_their_learning_curves():
    """The default Beauty checkpoint is the GPU recipe's; the committed curves are its history's."""
    from zerogr_core.recsys.curves import DEFAULT_CHECKPOINTS, DEFAULT_OUT, curves_document
    from zerogr_core.recsys.seqrec import BEAUTY_CHECKPOINT

    assert DEFAULT_CHECKPOINTS[0] == BEAUTY_CHECKPOINT
    text, runs = curves_document(DEFAULT_CHECKPOINTS)
    assert [r["preset"] for r in runs] == ["tiger", "cpu"]
    assert [r["train"].get("validity_weight", 0.0) for r in runs] == [0.0, 0.0]
    # The shipped cpu checkpoint is the current recipe's, trained within the preset's budget
    # (settings added since, such as the schedule, read back as their defaults).
    from zerogr_core.recsys.seqrec_config import SeqPreset, SeqTrainConfig

    cpu = SeqPreset.preset("cpu")
    assert SeqTrainConfig(**runs[1]["train"]) == cpu.train
    assert runs[1]["history"][-1]["elapsed_s"] <= 60 * cpu.train.max_minutes + 60
    previous = (ROOT / "runs" / "results" / "beauty-learning-curves-previous-cpu-recipe.md").read_text()
    assert "plus the validity term, W = 0.625" in previous.split("### `cpu` preset (model-cpu-validity.pt)")[1]
    assert runs[0]["train"]["seed"] == 0 and 1 <= runs[0]["selection"]["epoch"] <= len(runs[0]["history"])
    # The shipped tiger checkpoint is the current tiger preset's recipe.
    assert SeqTrainConfig(**runs[0]["train"]) == SeqPreset.preset("tiger").train
    assert DEFAULT_OUT.read_text() == text, "rerun python -m zerogr_core.recsys.curves"
    with pytest.raises(ZeroGRError, match="not a zerogr-seqrec-1 checkpoint"):
        curves_document([ROOT / "sample_catalogs" / "movielens" / "model.pt"])


def test_top1_disagreements_are_classified_and_consistent():
    """On an untrained T5 (much invalid mass) the two orders' top-1 items differ; every
    disagreement gets one class, the beam scores equal the teacher-forced ones, and the
    shrink sweep ends at scoring first's own rule (s = 0) and filtering first's (s = 1)."""
    pytest.importorskip("transformers")
    from zerogr_core import Catalog
    from zerogr_core.recsys.analysis import teacher_forced, top1_disagreements, top1_markdown
    from zerogr_core.recsys.t5 import T5Config, T5Recommender
    from zerogr_core.recsys.train import StudyModel

    torch.manual_seed(1)
    sizes = (4, 6, 6)
    model = T5Recommender(T5Config(encoder_layers=1, decoder_layers=1, d_model=16, n_heads=2, d_kv=8, d_ff=32,
                                   max_items=3, dropout=0.0), sizes)
    rng = np.random.default_rng(2)
    catalog = Catalog.from_sids(np.unique(np.stack([rng.integers(0, v, 40) for v in sizes], 1), axis=0), sizes)
    study = StudyModel(model, catalog, torch.from_numpy(catalog.sids.astype(np.int64)), {})
    histories = [rng.integers(0, catalog.n_items, int(rng.integers(1, 5))) for _ in range(24)]
    full, valid = teacher_forced(study, histories[0], np.arange(catalog.n_items))
    assert np.all(valid >= full - 1e-6) and np.allclose(valid[:, 0], full[:, 0])
    # filtering first's per-step log-probabilities sum to one over the valid tokens: over all items, 1 in total
    assert abs(np.exp(valid.sum(1)).sum() - 1) < 1e-4
    diag = top1_disagreements(study, histories, beam=8, candidates=8, shrink=(1.0, 0.0))
    assert diag["differ"] > 0 and sum(diag["classes"].values()) == diag["differ"]
    assert diag["max_score_error"] < 1e-4
    assert diag["shrink"][0.0] >= 1 - diag["classes"]["search_score_first"] / len(histories) - 1e-9
    if diag["classes"]["search_filter_first"] == 0:
        assert diag["shrink"][1.0] == pytest.approx(1 - diag["differ"] / len(histories))
    assert f"the top-1 items differ for {diag['differ']}" in top1_markdown(diag)


@pytest.mark.reference_kernels
def test_validity_term_ablation_trains_and_is_recorded(tmp_path, capsys):
    pytest.importorskip("transformers")
    from zerogr_core.recsys.t5 import T5Config, T5Recommender
    from zerogr_core.recsys.train import ValidityTables

    torch.manual_seed(0)
    model = T5Recommender(T5Config(encoder_layers=1, decoder_layers=1, d_model=16, n_heads=2, d_kv=8, d_ff=32,
                                   max_items=3, dropout=0.0), [3, 4, 5])
    sids = torch.tensor([[0, 0, 0], [0, 1, 4], [1, 3, 2], [2, 0, 1]])
    ids, mask = model.encoder_inputs([np.array([0, 1]), np.array([2])], sids)
    loss, bands = model.level_logits(ids, mask, sids[[1, 3]], sids[[0, 2]])
    torch.testing.assert_close(loss, model.loss(ids, mask, sids[[1, 3]]))
    assert [tuple(b.shape) for b in bands[1]] == [(2, 3), (2, 4), (2, 5)]
    from zerogr_core import Catalog
    tables = ValidityTables(Catalog.from_sids(sids.numpy(), [3, 4, 5]), torch.device("cpu"))
    assert float(tables.invalid_loss(bands[0], torch.tensor([1, 3])).detach()) > 0
    write_sequences(tmp_path / "seq.txt", n_users=30, n_items=20, seed=1)
    out = tmp_path / "v.pt"
    assert main(["train", "--data", str(tmp_path / "seq.txt"), "--preset", "tiny", "--validity-weight", "0.625",
                 "--out", str(out)]) == 0
    assert torch.load(out, weights_only=True)["study"]["train"]["validity_weight"] == 0.625
    assert main(["train", "--data", str(tmp_path / "seq.txt"), "--preset", "tiny", "--validity-weight", "-1",
                 "--out", str(out)]) == 2
    assert "argument --validity-weight: must be ≥ 0, got -1" in capsys.readouterr().err
    # Quality reports of the plain and the validity checkpoint of one preset live side by side,
    # and the ablation document compares them.
    plain = tmp_path / "p.pt"
    assert main(["train", "--data", str(tmp_path / "seq.txt"), "--preset", "tiny", "--out", str(plain)]) == 0
    for ckpt in (plain, out):
        assert main(["quality", "--data", str(tmp_path / "seq.txt"), "--checkpoint", str(ckpt), "--beam", "20",
                     "--users", "20", "--results", str(tmp_path)]) == 0
    reports = [tmp_path / "quality-seq-tiny.json", tmp_path / "quality-seq-tiny-validity0.625.json"]
    from zerogr_core.recsys.ablation import ablation_document, summary_table
    text = ablation_document(reports)
    table = summary_table([json.loads(r.read_text()) for r in reports])
    assert table in text and "| 20 test users, beam 20 | plain (`p.pt`) | validity term W = 0.625 (`v.pt`) |" in table
    validity = json.loads(reports[1].read_text())
    assert f"| overlap@1 | {100 * json.loads(reports[0].read_text())['overlap']['1']:.2f} % | " \
           f"{100 * validity['overlap']['1']:.2f} % |" in table
    validity["users"] = 19
    (tmp_path / "other.json").write_text(json.dumps(validity))
    with pytest.raises(ZeroGRError, match="other.json: field .users. differs"):
        ablation_document([reports[0], tmp_path / "other.json"])


def _ablation_reports(folder: Path, ks: list[int], selection_k: int) -> list[Path]:
    """The committed ablation pair, cut to the Ks ``ks`` (as quality writes them for a smaller beam)."""
    from zerogr_core.recsys.ablation import DEFAULT_REPORTS

    paths = []
    for i, source in enumerate((DEFAULT_REPORTS[0], DEFAULT_REPORTS[2])):
        report = json.loads(source.read_text())
        keys = [str(k) for k in ks]
        for name, value in list(report.items()):
            if isinstance(value, dict) and set(value) == {str(k) for k in report["k"]}:
                report[name] = {k: value[k] for k in keys}
        report["k"], report["beam"], report["selection"]["k"] = ks, ks[-1], selection_k
        paths.append(folder / f"r{i}.json")
        paths[-1].write_text(json.dumps(report))
    return paths


def test_the_ablation_labels_the_ks_its_reports_measured(tmp_path):
    """Reports of beam 20 (K = 1 … 20), their model selected at K = 5: the summary said 'min overlap over
    K = 1 … 128' and 'validation Recall@10 / NDCG@10' whatever the reports held."""
    from zerogr_core.recsys.ablation import ablation_document, summary_table

    paths = _ablation_reports(tmp_path, [1, 5, 10, 20], 5)
    table = summary_table([json.loads(p.read_text()) for p in paths])
    assert "| min overlap over K = 1 … 20 |" in table and "| kept epoch, validation Recall@5 / NDCG@5 |" in table
    assert table in ablation_document(paths)


def test_the_ablation_refuses_reports_without_the_ks_it_compares(tmp_path):
    """Reports of quality --beam 8 hold K = 1 and 5: the ablation failed with KeyError: '10' and a traceback."""
    from zerogr_core.recsys.ablation import main as ablation_main

    paths = _ablation_reports(tmp_path, [1, 5], 5)
    with pytest.raises(ZeroGRError, match=r"r0.json: field 'k' is \[1, 5\]; the summary compares K = 1, 5, 10: "
                                          r"write the reports with quality --beam 10 or more"):
        ablation_main([str(p) for p in paths] + ["--out", str(tmp_path / "a.md")])
    assert not (tmp_path / "a.md").exists()


@pytest.mark.reference_kernels
def test_compiled_training_step_follows_the_eager_one(tmp_path):
    """``train --compile`` pads every batch to the full history width and runs it through
    torch.compile: the padding is masked, so (without dropout, as in the tiny preset) each
    epoch's losses equal the eager run's up to rounding, and the checkpoint says it was compiled."""
    pytest.importorskip("transformers")
    from zerogr_core.recsys.seqrec import load_sequences, train_sequences

    write_sequences(tmp_path / "seq.txt", n_users=30, n_items=20, seed=1)
    data = load_sequences(tmp_path / "seq.txt", None)
    runs = {flag: train_sequences(data, tmp_path / f"m{int(flag)}.pt", preset="tiny", device="cpu", compile=flag,
                                  log=lambda *a: None) for flag in (False, True)}
    eager, compiled = (runs[flag]["history"] for flag in (False, True))
    assert len(eager) == len(compiled) >= 2
    for e, c in zip(eager, compiled):
        assert c["train_loss"] == pytest.approx(e["train_loss"], rel=1e-5), (e, c)
        assert c["valid_loss"][0] == pytest.approx(e["valid_loss"][0], rel=1e-5), (e, c)
    assert runs[True]["compiled"] is True and runs[False]["compiled"] is False


def test_a_compile_failure_is_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from torch._dynamo.exc import TorchDynamoException

    def broken(fn):
        def step(*args):
            raise TorchDynamoException("backend 'inductor' failed: no C++ compiler found\nlong trace ...")
        return step

    monkeypatch.setattr(torch, "compile", broken)
    write_sequences(tmp_path / "seq.txt", n_users=30, n_items=20, seed=1)
    assert main(["train", "--data", str(tmp_path / "seq.txt"), "--preset", "tiny", "--out", str(tmp_path / "m.pt"),
                 "--compile"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--compile: torch.compile could not build the training step" in err
    assert "no C++ compiler found" in err and "Traceback" not in err and not (tmp_path / "m.pt").exists()


def test_bundled_beauty_sid_file_matches_its_maker():
    """sample_catalogs/amazon-beauty/sid_catalog.csv is what bundled_sid_catalog writes."""
    from zerogr_core.catalog.samples import open_catalog
    from zerogr_core.recsys.sequences import bundled_sid_catalog

    on_disk, fresh = open_catalog("amazon-beauty"), bundled_sid_catalog("amazon-beauty")
    assert np.array_equal(on_disk.sids, fresh.sids)
    assert np.array_equal(on_disk.item_ids.astype(str), fresh.item_ids.astype(str))
    assert on_disk.codebook_sizes == fresh.codebook_sizes


def test_t5_staged_requests_decode_as_hidden_fn_for():
    pytest.importorskip("transformers")
    from zerogr_core import Decoder, build_index

    model, catalog, sids = tiny_t5()
    staged = model.staged(3, sids)
    dec = Decoder(build_index(catalog), model.head_weights(), 6)
    # one staged object refilled per batch (histories shorter than, equal to and over max_items)
    for histories in ([np.array([3]), np.arange(9), np.array([5, 1, 2])], [np.array([7, 8]), np.array([1]),
                                                                          np.arange(4)]):
        staged.load(histories)
        got = dec.decode(staged, 3)
        ref = dec.decode(model.hidden_fn_for(histories, sids), 3)
        assert torch.equal(got.item_rows, ref.item_rows)
        torch.testing.assert_close(got.scores, ref.scores, atol=1e-5, rtol=1e-5)
