"""The serving package without Ray: request validation, padding to planned sizes, catalog
pushes, the batched recommender on the bundled MovieLens model, and the CLI's errors."""
import json

import numpy as np
import pytest
import torch

from zerogr_core.cli import main
from zerogr_core.errors import ZeroGRError
from zerogr_core.serve.batching import Batcher, chunks, pad, padded_size
from zerogr_core.serve.config import ServeConfig
from zerogr_core.serve.live import CatalogPush
from zerogr_core.serve.metrics import Histogram, ServeMetrics
from zerogr_core.serve.schema import MAX_BODY_BYTES, MAX_LIST, Query, RequestError, parse_query, read_limited


# ---------------------------------------------------------------------------- schema
def test_a_good_body_parses_with_defaults():
    q = parse_query(b'{"history": [3, 1, 2]}', max_k=32)
    assert q == Query((3, 1, 2), 10, (), False)
    q = parse_query('{"history": ["a"], "k": 32, "exclude": ["b"], "keep_history": true}', max_k=32, string_ids=True)
    assert q == Query(("a",), 32, ("b",), True)
    assert parse_query(b'{"history": [1], "allow": [4, 5]}', max_k=8).allow == (4, 5)
    assert parse_query(b'{"history": [1], "allow": null}', max_k=8).allow is None
    assert parse_query(b'{"history": [1], "allow": []}', max_k=8).allow == ()


def test_default_k_is_at_most_the_beam_width():
    assert parse_query(b'{"history": [1]}', max_k=4).k == 4
    assert parse_query(b'{"history": [1]}', max_k=32).k == 10


@pytest.mark.parametrize("body, status, words", [
    (b'{"history": [1, 2', 400, "not valid JSON"),
    (b"\xff\xfe", 400, "UTF-8"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"history": [1], "user": 5}', 400, "unknown field 'user'"),
    (b'{"k": 3}', 400, "history: required"),
    (b'{"history": []}', 400, "at least one"),
    (b'{"history": 7}', 400, "expected a list"),
    (b'{"history": [1, "2"]}', 400, "history[1]"),
    (b'{"history": [1, true]}', 400, "history[1]"),
    (b'{"history": [1], "k": 0}', 400, "k: 0 is out of range 1…16"),
    (b'{"history": [1], "k": 17}', 400, "out of range"),
    (b'{"history": [1], "k": 2.5}', 400, "k: expected an integer"),
    (b'{"history": [1], "exclude": [null]}', 400, "exclude[0]"),
    (b'{"history": [1], "allow": 3}', 400, "allow: expected a list"),
    (b'{"history": [1], "allow": [1, "x"]}', 400, "allow[1]"),
    (b'{"history": [1], "keep_history": 1}', 400, "keep_history"),
    (json.dumps({"history": list(range(10_001))}).encode(), 413, "at most"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    (b'{"history": [' + b"9" * 5000 + b"]}", 400, "cannot be read"),
    (b'{"history": [99999999999999999999999]}', 400, "history[0]: item id 99999999999999999999999 is outside"),
    (b'{"history": [1], "exclude": [9223372036854775808]}', 400, "exclude[0]"),
    (b'{"history": [1], "k": NaN}', 400, "body holds NaN, which is not JSON"),
    (b'{"history": [-Infinity]}', 400, "body holds -Infinity"),
    (b'{"history": [1], "k": 3, "k": 5}', 400, "body gives the field 'k' twice"),
])
def test_bad_bodies_get_a_4xx_naming_the_field(body, status, words):
    with pytest.raises(RequestError) as err:
        parse_query(body, max_k=16)
    assert err.value.status == status and words in str(err.value)
    assert "\n" not in str(err.value)


def test_the_body_limit_holds_the_largest_legal_requests():
    ids = [f"sku-{i:060d}" for i in range(MAX_LIST)]  # 64-character string ids
    recommend = {"history": list(range(170_000, 178_192)), "k": 10, "exclude": ids, "allow": ids}
    generate = {"input_ids": [[176_511] * 8192] * 64, "rid": ["r" * 256] * 64}  # 64 inputs of 8,192 tokens
    for doc in (dict(recommend, history=ids), recommend, generate):
        assert len(json.dumps(doc).encode()) < MAX_BODY_BYTES / 1.5


def test_a_body_over_the_limit_is_refused_without_reading_the_rest():
    import asyncio

    def stream(chunks, read):
        async def chunks_of():
            for chunk in chunks:
                read.append(chunk)
                yield chunk
        return chunks_of()

    read = []
    with pytest.raises(RequestError) as err:
        asyncio.run(read_limited(str(MAX_BODY_BYTES + 1), stream([b"{}"], read)))
    assert err.value.status == 413 and read == []  # the declared length alone refuses it
    assert str(err.value) == f"body: {MAX_BODY_BYTES + 1} bytes, at most {MAX_BODY_BYTES} bytes (8 MiB) a request"
    with pytest.raises(RequestError) as err:  # chunked, or longer than declared: refused as the stream passes it
        asyncio.run(read_limited("10", stream([b"x" * 40] * 10, read), limit=100))
    assert err.value.status == 413 and len(read) == 3 and "body: 120 bytes so far, at most 100 bytes" in str(err.value)
    assert asyncio.run(read_limited(None, stream([b'{"a"', b": 1}"], []), limit=9)) == b'{"a": 1}'
    assert asyncio.run(read_limited("bogus", stream([b"{}"], []))) == b"{}"


# ---------------------------------------------------------------------------- batching, config, metrics
def test_batches_pad_to_the_nearest_planned_size():
    sizes = (1, 4, 16)
    assert [padded_size(n, sizes) for n in (1, 2, 4, 5, 16)] == [1, 4, 4, 16, 16]
    with pytest.raises(ZeroGRError, match="exceed the largest"):
        padded_size(17, sizes)
    assert pad(["a", "b"], 4) == ["a", "b", "a", "a"]
    assert [list(r) for r in chunks(5, 2)] == [[0, 1], [2, 3], [4]]


def test_a_cancelled_request_is_dropped_and_the_batcher_keeps_serving():
    import threading

    release, ran, cancelled = threading.Event(), [], []

    def run(items):
        ran.append(list(items))
        release.wait(10)
        return [x * 10 for x in items]

    batcher = Batcher(run, max_batch=4, wait_s=0.0, on_cancel=cancelled.append)
    first = batcher.submit_future(1)
    while not ran:  # the worker is decoding 1; 2 and 3 wait behind it
        threading.Event().wait(0.01)
    gone, kept = batcher.submit_future(2), batcher.submit_future(3)
    assert gone.cancel()  # its client went away while it waited
    release.set()
    assert first.result(10) == 10 and kept.result(10) == 30
    assert batcher.submit_future(4).result(10) == 40  # the worker lives on (it died setting 2's result)
    assert ran == [[1], [3], [4]] and cancelled == [1]


def test_config_presets_and_checks():
    assert ServeConfig.preset("gpu").beam == 128 and ServeConfig.preset("cpu").max_batch == 16
    assert ServeConfig(batch_sizes=(8, 1, 8)).batch_sizes == (1, 8)
    for bad in (dict(beam=0), dict(batch_sizes=()), dict(batch_sizes=(0,)), dict(engine="fast")):
        with pytest.raises(ZeroGRError):
            ServeConfig(**bad)
    cfg = ServeConfig(catalog="x.csv", batch_sizes=(2, 4))
    assert ServeConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_config_takes_whole_numbers_and_refuses_the_rest():
    """beam=True passed as a beam of 1, a text wait raised TypeError, 8.0 and numpy integers were refused;
    the LLM server's configuration checks the same three fields the same way (serve.batching)."""
    import numpy as np

    cfg = ServeConfig(beam=8.0, batch_sizes=(np.int64(4), 1), batch_wait_s=0)
    assert (cfg.beam, cfg.batch_sizes, cfg.batch_wait_s) == (8, (1, 4), 0.0) and type(cfg.beam) is int
    for bad, words in [(dict(beam=True), r"^beam: expected a positive integer, got True$"),
                       (dict(beam=2.5), r"^beam: "), (dict(batch_sizes=(1, 2.5)), r"^batch_sizes: "),
                       (dict(batch_sizes=4), r"^batch_sizes: "), (dict(batch_wait_s="x"), r"^batch_wait_s: "),
                       (dict(batch_wait_s=True), r"^batch_wait_s: "), (dict(batch_wait_s=11), r"^batch_wait_s: ")]:
        with pytest.raises(ZeroGRError, match=words):
            ServeConfig(**bad)


def test_metrics_count_latency_batches_and_queue():
    seen = []

    class Exporter:
        def __getattr__(self, name):
            return lambda *v: seen.append((name,) + v)

    m = ServeMetrics(Exporter())
    for _ in range(3):
        m.enqueue()
    assert m.snapshot()["queue_length"] == 3
    m.batch(3, 4)
    for ms in (3.0, 40.0, 40.0):
        m.answered(200, ms)
    m.answered(422)
    snap = m.snapshot()
    assert snap["queue_length"] == 0 and snap["batch_sizes"] == {"3": 1} and snap["padded_batch_sizes"] == {"4": 1}
    assert snap["responses"] == {"200": 3, "422": 1} and snap["latency_ms"]["count"] == 3
    assert snap["latency_ms"]["p50_bucket"] == 50 and ("batch", 3, 4) in seen and ("latency", 3.0) in seen
    h = Histogram((1, 10))
    h.observe(100)
    assert h.quantile(0.5) == float("inf")


def test_catalog_pushes_are_validated():
    assert CatalogPush.from_config({"version": 2, "deleted": [5]}) == CatalogPush(2, None, (5,))
    for bad in ({"version": 0}, {"deleted": []}, {"version": 2, "catalog": 3}, {"version": 2, "extra": 1},
                {"version": 2, "deleted": 5}, [1]):
        with pytest.raises(ZeroGRError, match="catalog push"):
            CatalogPush.from_config(bad)


# ---------------------------------------------------------------------------- the recommender
@pytest.fixture(scope="module")
def rec():
    import os

    from zerogr_core.recsys import movielens
    from zerogr_core.serve.recommender import Recommender

    if not movielens.available():
        pytest.skip("the bundled MovieLens model is not there")
    # Triton picks interpreter or compiler when a kernel module is imported: import the
    # constraint kernels under the session's setting, before switching to the references
    import zerogr_core.decode.constraints  # noqa: F401

    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"  # reference ops (the interpreter would take minutes)
    yield Recommender(ServeConfig(beam=8, batch_sizes=(1, 4), engine="reference", warmup=False), device="cpu")
    os.environ["TRITON_INTERPRET"] = old if old is not None else ""


def test_a_batch_answers_each_request_and_refuses_unknown_ids_alone(rec):
    ids = rec.catalog.item_ids
    history = (int(ids[10]), int(ids[20]), int(ids[30]))
    queries = [Query(history, 5), Query((987654321,), 3), Query(history, 8, keep_history=True),
               Query(history, 5, exclude=(12345678,))]
    out = rec.recommend(queries)
    assert isinstance(out[1], RequestError) and out[1].status == 422 and "history[0]: item id 987654321" in str(out[1])
    # indexed from 0, as the parser's own field errors are
    assert isinstance(out[3], RequestError) and str(out[3]).startswith("exclude[0]: item id 12345678 is not in")
    a, kept = out[0], out[2]
    assert len(a.items) == 5 and a.catalog_version == 1 and a.scores == sorted(a.scores, reverse=True)
    assert not set(a.items) & set(history)  # history excluded by default
    alone = rec.recommend([Query(history, 5)])[0]  # padded to 1, not to 4: the same answer
    assert alone.items == a.items and np.allclose(alone.scores, a.scores, atol=1e-5)
    excluded = rec.recommend([Query(history, 5, exclude=tuple(a.items[:2]))])[0]
    assert len(excluded.items) == 5 and not set(excluded.items) & (set(a.items[:2]) | set(history))
    # keep_history: no list at all, the plain decode's beams
    v = rec.live.store.current
    fn = rec.study.model.hidden_fn_for([v.catalog.rows_of(list(history))], rec._sids_of(v.catalog))
    plain = v.decoder.decode(fn, 1)
    order = plain.scores[0].argsort(descending=True, stable=True)
    assert kept.rows.tolist() == plain.item_rows[0][order].tolist()


def test_allow_lists_restrict_each_request_alone(rec):
    ids = rec.catalog.item_ids
    history = (int(ids[10]), int(ids[20]), int(ids[30]))
    free = rec.recommend([Query(history, 8)])[0]
    allowed = tuple(int(i) for i in ids[100:400:3])  # 100 items, none of the free answer's, nor the history
    allowed = tuple(i for i in allowed if i not in set(free.items) | set(history))
    out = rec.recommend([Query(history, 8, allow=allowed), Query(history, 8),
                         Query(history, 8, allow=allowed, exclude=allowed[:50]), Query(history, 8, allow=()),
                         Query(history, 8, allow=(987654321,))])
    only, plain, both, none, unknown = out
    assert len(only.items) == 8 and set(only.items) <= set(allowed)
    assert plain.items == free.items  # a neighbour's allow list changes nothing of this request's
    assert len(both.items) == 8 and set(both.items) <= set(allowed[50:])
    assert none.items == []
    assert isinstance(unknown, RequestError) and unknown.status == 422 and "allow" in str(unknown)


def test_more_requests_than_the_largest_size_run_in_several_padded_batches(rec):
    ids = rec.catalog.item_ids
    queries = [Query((int(ids[i]),), 3) for i in range(6)]
    together = rec.recommend(queries)  # runs of 4 and 2, padded to 4
    assert len(together) == 6 and all(len(a.items) == 3 for a in together)
    for i in (0, 5):
        assert rec.recommend([queries[i]])[0].items == together[i].items


def test_pushes_delete_at_once_undelete_by_rebuild_and_carry_their_label(rec):
    ids = rec.catalog.item_ids
    q = Query((int(ids[1]), int(ids[2])), 5)
    before = rec.recommend([q])[0]
    assert rec.push(CatalogPush(4, deleted=(before.items[0],))) == 4
    after = rec.recommend([q])[0]
    assert after.catalog_version == 4 and before.items[0] not in after.items and after.items[0] == before.items[1]
    rec.push(CatalogPush(4, deleted=(before.items[0],)))  # the same push again (a restarted replica): no change
    assert rec.live.store.version == 2
    rec.push(CatalogPush(5))
    again = rec.recommend([q])[0]
    assert again.items == before.items and again.catalog_version == 5
    with pytest.raises(ZeroGRError, match="older than the served 5"):
        rec.push(CatalogPush(3))
    with pytest.raises(ZeroGRError):
        rec.push(CatalogPush(6, catalog="no/such/catalog.csv"))
    assert rec.recommend([q])[0].catalog_version == 5


# ---------------------------------------------------------------------------- CLI errors
@pytest.mark.parametrize("argv, words", [
    (["decode-dataset", "--out", "x.jsonl", "--k", "0"], "argument --k: must be ≥ 1, got 0"),
    (["decode-dataset", "--out", "x.jsonl", "--beam", "4", "--k", "5"], "--k: 5 is over the beam width 4"),
    (["decode-dataset", "--out", "x.jsonl", "--beam", "many"], "argument --beam: 'many' is not a whole number"),
    (["decode-dataset", "--out", "x.jsonl", "--batch-sizes", "2,4"], "plans one batch size"),
    (["decode-dataset", "--out", "x.jsonl", "--checkpoint", "m.pt"], "--input FILE is required"),
    # a replica pads every batch to a planned size: 16 × 100,000 beams per decode ran for hours
    (["decode-dataset", "--out", "x.jsonl", "--preset", "cpu", "--beam", "100000"],
     "--batch-sizes × --beam: 16 × 100000 beams is over the 65,536 one decode may hold"),
    (["decode-dataset", "--out", "x.jsonl", "--beam", "8", "--batch-sizes", "100000"],
     "--batch-sizes × --beam: 100000 × 8 beams is over the 65,536"),
    (["serve", "--beam", "4096", "--batch-sizes", "1,64"], "--batch-sizes × --beam: 64 × 4096 beams is over"),
    (["serve", "--llm", "tiny", "--beam", "70000"], "--batch-sizes × --beam: "),
    (["serve", "--port", "70000"], "argument --port: must be in 1…65535, got 70000"),
    pytest.param(["decode-dataset", "--out", "x.jsonl", "--engine", "eager"], "needs a CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")),
    (["serve", "--replicas", "0"], "argument --replicas: must be ≥ 1, got 0"),
    (["serve", "--checkpoint", "no/such.pt"], "--checkpoint no/such.pt: checkpoint not found"),
    # the wait is checked with the command line and named as given, in ms, for both servers
    (["serve", "--batch-wait-ms", "-5"], "argument --batch-wait-ms: must be in 0…10000 milliseconds, got -5"),
    (["serve", "--batch-wait-ms", "nan"], "argument --batch-wait-ms: must be in 0…10000 milliseconds, got nan"),
    (["serve", "--llm", "tiny", "--batch-wait-ms", "x"], "argument --batch-wait-ms: 'x' is not a number of millisec"),
])
def test_cli_errors_are_one_line(argv, words, capsys):
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_serve_refuses_a_port_in_use_in_one_line(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}: cannot listen there" in err and "Traceback" not in err


def test_decode_dataset_names_the_bad_input_line(tmp_path, capsys):
    bad = tmp_path / "users.jsonl"
    bad.write_text('{"user": 1, "history": [1, 2]}\n{"user": 2, "history": []}\n')
    assert main(["decode-dataset", "--input", str(bad), "--out", str(tmp_path / "o.jsonl"), "--beam", "4",
                 "--k", "3"]) == 1
    err = capsys.readouterr().err
    assert "line 2" in err and "Traceback" not in err


@pytest.mark.parametrize("entry, words", [
    ({"history": [[1], 50]}, "line 2: history[0]: item id [1] is not an integer or a string"),
    ({"history": [1, {"a": 1}]}, "line 2: history[1]: item id {'a': 1} is not an integer or a string"),
    ({"history": [None]}, "line 2: history[0]: item id None is not an integer or a string"),
    ({"history": [True]}, "line 2: history[0]: item id True is not an integer or a string"),
    ({"history": [1], "exclude": [2, [3]]}, "line 2: exclude[1]"),
    ({"history": [1], "allow": [1.5]}, "line 2: allow[0]: item id 1.5"),
    ({"history": [2**70]}, "line 2: history[0]: item id 1180591620717411303424 is outside the 64-bit range"),
])
def test_decode_dataset_names_a_bad_item_id_before_the_model_loads(tmp_path, capsys, entry, words):
    users = tmp_path / "users.jsonl"
    users.write_text(json.dumps({"user": 1, "history": [1, 2]}) + "\n" + json.dumps(entry) + "\n")
    # a nested id reached the catalog's lookup after the model loaded: numpy's ValueError, a traceback
    assert main(["decode-dataset", "--input", str(users), "--out", str(tmp_path / "o.jsonl"), "--beam", "4",
                 "--k", "3"]) == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_users_come_from_json_lines_or_one_interactions_object(tmp_path):
    from zerogr_core.serve.offline import read_users, shard

    lines = tmp_path / "u.jsonl"
    lines.write_text('{"user": "a", "history": [1, 2]}\n\n{"history": [3]}\n')
    users = read_users(lines)
    assert users.labels == ["a", 3] and users.histories == [(1, 2), (3,)]
    whole = tmp_path / "inter.json"
    whole.write_text(json.dumps({"7": [4, 5], "8": [6]}, indent=2))
    assert read_users(whole).histories == [(4, 5), (6,)] and read_users(whole).head(1).labels == ["7"]
    whole.write_text(json.dumps({"7": []}))
    with pytest.raises(ZeroGRError, match="user '7'"):
        read_users(whole)
    whole.write_text(json.dumps({"7": [4, [5]]}))
    with pytest.raises(ZeroGRError, match=r"user '7': history\[1\]: item id \[5\] is not an integer or a string"):
        read_users(whole)
    lines.write_text('{"user": "a", "history": [1], "allow": [5, 6], "exclude": [6]}\n'
                     '{"history": [3], "allow": null}\n')
    users = read_users(lines)
    assert users.query(0, 4, False) == Query((1,), 4, (6,), False, (5, 6)) and users.query(1, 4, True).allow is None
    lines.write_text('{"history": [1]}\n{"history": [3], "allow": 5}\n')
    with pytest.raises(ZeroGRError, match="line 2: allow must be a list of item ids, got int"):
        read_users(lines)
    assert [list(shard(5, r, 2)) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert [len(shard(7, r, 3)) for r in range(3)] == [3, 2, 2]


def test_users_file_that_reads_both_ways_is_refused(tmp_path):
    # An interactions object with a user named "history" was read as one JSON-lines user: the others were dropped.
    from zerogr_core.serve.offline import read_users

    whole = tmp_path / "inter.json"
    for doc in ({"history": [1, 2], "7": [3]}, {"history": [1, 2]}):
        for indent in (None, 2):
            whole.write_text(json.dumps(doc, indent=indent))
            with pytest.raises(ZeroGRError) as err:
                read_users(whole)
            assert "ambiguous" in str(err.value) and "inter.json" in str(err.value) and "\n" not in str(err.value)
    # A JSON-lines user with a "user" field, alone in its file, still reads as one.
    whole.write_text('{"user": "a", "history": [1, 2]}\n')
    assert read_users(whole).labels == ["a"] and read_users(whole).histories == [(1, 2)]
    whole.write_text(json.dumps({"7": [4, 5], "8": [6]}))
    assert read_users(whole).labels == ["7", "8"]


@pytest.mark.parametrize("text,words", [
    (None, ["catalog tiny does not fit the model", "column 'codebook_sizes'", "the SIDs have 3 levels"]),
    ("item_id,s1,s2,s3,s4\n1,200,0,0,0\n", ["does not fit the model", "row 1", "column 's1'",
                                            "token 200 ≥ codebook size 128"]),
])
def test_serve_names_a_catalog_that_does_not_fit_the_model(tmp_path, capsys, text, words):
    spec = "tiny"
    if text is not None:
        spec = str(tmp_path / "wide.csv")
        (tmp_path / "wide.csv").write_text(text)
    code = main(["serve", "--catalog", spec, "--port", "8765"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
