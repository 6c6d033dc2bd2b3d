"""Serving the Qwen3 recommender on the CPU (tiny shape, float32, reference ops): SGLang-style
/generate equals a direct decoder call, /ready before and after loading, Prometheus /metrics
counts, malformed requests get a one-line 4xx while the server keeps serving, concurrent
clients get their own answers, and the in-process load test's quick mode."""
import asyncio
import json
import os
import re
import threading

import numpy as np
import pytest
import torch

from zerogr_core.cli import main
from zerogr_core.errors import ZeroGRError
from zerogr_core.serve.llm import LLMRecommender, LLMServeConfig
from zerogr_core.serve.llm_service import LLMService

CONFIG = LLMServeConfig.preset("tiny", batch_wait_s=0.02)
TOL = dict(rtol=1e-5, atol=1e-5)  # float32


@pytest.fixture(scope="module", autouse=True)
def reference_ops():
    # the kernels' PyTorch references on CPU tensors (the Triton interpreter would take minutes);
    # module-wide because the service loads and decodes in its own threads
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    yield
    os.environ["TRITON_INTERPRET"] = old if old is not None else ""


@pytest.fixture(scope="module")
def service(reference_ops):
    svc = LLMService(CONFIG)
    svc.wait_ready(300)
    return svc


def call(svc, method, path, body=None, query=""):
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else (body or b"")
    return asyncio.run(svc.handle(method, path, query, data))


def direct(rec, context, n):
    """The same request through a fresh step model and StepDecoder (no server code)."""
    from zerogr_core.models.protocol import StepDecoder
    from zerogr_core.models.qwen3 import Qwen3StepModel

    sm = Qwen3StepModel(rec.model, rec.offsets, context_bucket=CONFIG.context_bucket)
    dec = StepDecoder(sm, rec.index, sm.head, beam_width=CONFIG.beam, band_offsets=rec.offsets)
    with torch.no_grad():
        r = dec.decode(torch.tensor([context]))
    scores, rows, tokens = r.scores[0].float().cpu(), r.item_rows[0].cpu(), r.tokens[0].long().cpu()
    order = torch.argsort(scores, descending=True, stable=True)
    order = order[torch.isfinite(scores[order]) & (rows[order] >= 0)][:n]
    return (rec.catalog.ids_of_rows(rows[order].numpy()).tolist(), scores[order].numpy(),
            tokens[order].numpy())


def contexts(count, seed=0, low=3, high=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, int(rng.integers(low, high))).tolist() for _ in range(count)]


def check(result, rec, context, n):
    items, scores, codes = direct(rec, context, n)
    beams = result["beam_results"]
    assert [b["item"] for b in beams] == items
    np.testing.assert_allclose([b["score"] for b in beams], scores, **TOL)
    assert [b["sid"] for b in beams] == codes.tolist()
    assert [b["output_ids"] for b in beams] == (codes + np.asarray(rec.offsets)).tolist()
    # every item is in the catalog, with the catalog's SID
    rows = rec.catalog.rows_of(items)
    assert (rec.catalog.sids[rows].astype(np.int64) == codes).all()
    assert result["meta_info"]["prompt_tokens"] == len(context) and result["meta_info"]["completion_tokens"] == 3


def test_generate_equals_a_direct_decoder_call(service):
    rec = service.rec
    one, two = contexts(2, seed=1)
    reply = call(service, "POST", "/generate", {"input_ids": one, "sampling_params": {"max_new_tokens": 3, "n": 5},
                                                "rid": "r1"})
    assert reply.status == 200, reply.body
    doc = reply.json()
    assert len(doc["beam_results"]) == 5 and doc["meta_info"]["id"] == "r1"
    check(doc, rec, one, 5)
    # a batched request: a list of answers, each as the input alone; n defaults to the beam
    reply = call(service, "POST", "/generate", {"input_ids": [one, two], "sampling_params": {"beam_width": 16}})
    assert reply.status == 200, reply.body
    docs = reply.json()
    assert isinstance(docs, list) and len(docs) == 2 and len(docs[1]["beam_results"]) == CONFIG.beam
    check(docs[0], rec, one, CONFIG.beam)
    check(docs[1], rec, two, CONFIG.beam)
    # SGLang's batched rid: one per input (a single string labels every input)
    reply = call(service, "POST", "/generate", {"input_ids": [one, two], "rid": ["a", "b"],
                                                "sampling_params": {"n": 1}})
    assert [d["meta_info"]["id"] for d in reply.json()] == ["a", "b"]
    reply = call(service, "POST", "/generate", {"input_ids": [one, two], "rid": "c", "sampling_params": {"n": 1}})
    assert [d["meta_info"]["id"] for d in reply.json()] == ["c", "c"]


def test_recommend_takes_token_history_and_excludes_items(service):
    rec = service.rec
    context = contexts(1, seed=2)[0]
    items, scores, _ = direct(rec, context, 4)
    reply = call(service, "POST", "/recommend", {"history": context, "k": 4})
    assert reply.status == 200 and reply.json()["items"] == items
    reply = call(service, "POST", "/recommend", {"history": context, "k": 4, "exclude": items[:2]})
    assert reply.status == 200
    got = reply.json()["items"]
    assert not set(got) & set(items[:2]) and got[:2] == items[2:4]
    reply = call(service, "POST", "/recommend", {"history": context, "k": 4, "allow": items[1:3]})
    assert reply.status == 200 and reply.json()["items"] == items[1:3]  # the two allowed, in their order
    reply = call(service, "POST", "/recommend", {"history": context, "k": 4, "allow": items[1:3],
                                                 "exclude": items[1:2]})
    assert reply.status == 200 and reply.json()["items"] == items[2:3]


def test_concurrent_clients_get_their_own_answers(service):
    rec = service.rec
    ctxs = contexts(10, seed=3)
    before = service.metrics.snapshot()["batch_sizes"]

    async def many():
        return await asyncio.gather(*(service.handle("POST", "/generate", "", json.dumps(
            {"input_ids": c, "sampling_params": {"n": 6}}).encode()) for c in ctxs))

    replies = asyncio.run(many())
    for c, r in zip(ctxs, replies):
        assert r.status == 200, r.body
        check(r.json(), rec, c, 6)
    after = service.metrics.snapshot()["batch_sizes"]
    grown = {int(k): v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    assert sum(k * v for k, v in grown.items()) == 10 and max(grown) > 1  # gathered into batches
    # and from several threads, each with its own event loop
    results = {}

    def client(i):
        results[i] = call(service, "POST", "/generate", {"input_ids": ctxs[i], "sampling_params": {"n": 3}})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert results[i].status == 200
        check(results[i].json(), rec, ctxs[i], 3)


@pytest.mark.parametrize("body, status, words", [
    (b'{"input_ids": [1, 2', 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    ({"input_ids": [1], "prompt": "x"}, 400, "unknown field 'prompt'"),
    ({"text": "hello"}, 400, "text: this server takes input_ids"),
    ({"sampling_params": {}}, 400, "input_ids: required"),
    ({"input_ids": []}, 400, "input_ids: expected a non-empty list"),
    ({"input_ids": [1, "2"]}, 400, "input_ids[1]"),
    ({"input_ids": [[1], [2, 10**6]]}, 400, "input_ids[1][1]: 1000000 is not a token id in 0…255"),
    ({"input_ids": [1, -1]}, 400, "input_ids[1]"),
    ({"input_ids": list(range(1025))}, 413, "at most 1024"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 16}}, 400, "max_new_tokens: must be 3"),
    ({"input_ids": [1], "sampling_params": {"beam_width": 8}}, 400, "beam_width: this server decodes at beam 16"),
    ({"input_ids": [1], "sampling_params": {"num_beams": 32}}, 400, "num_beams"),
    ({"input_ids": [1], "sampling_params": {"n": 0}}, 400, "sampling_params.n: 0 is out of range 1…16"),
    ({"input_ids": [1], "sampling_params": {"n": 17}}, 400, "sampling_params.n"),
    ({"input_ids": [1], "sampling_params": {"temperature": 0.7}}, 400, "temperature"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0.9}}, 400, "sampling_params.top_p: not supported"),
    ({"input_ids": [1], "sampling_params": 3}, 400, "sampling_params: expected an object"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}]}, 400, "sampling_params: 1 objects for 2 inputs"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}, {"n": 99}]}, 400, "sampling_params[1].n"),
    ({"input_ids": [1], "stream": True}, 400, "stream"),
    # bounded work: one request's inputs, and its rid (echoed in every answer)
    ({"input_ids": [[1]] * 65}, 413, "input_ids: 65 inputs, at most 64"),
    ({"input_ids": [1], "rid": "r" * 257}, 400, "rid: 257 characters, at most 256"),
    ({"input_ids": [1], "rid": {"nested": [1, 2]}}, 400, "rid: expected a string, got dict"),
    ({"input_ids": [1], "rid": ["a"]}, 400, "rid: expected a string, got list"),
    ({"input_ids": [[1], [2]], "rid": ["a"]}, 400, "rid: 1 ids for 2 inputs"),
    ({"input_ids": [[1], [2]], "rid": ["a", 7]}, 400, "rid[1]: expected a string, got int"),
])
def test_malformed_generate_gets_a_one_line_4xx_and_serving_goes_on(service, body, status, words):
    reply = call(service, "POST", "/generate", body)
    assert reply.status == status, reply.body
    message = reply.json()["error"]
    assert words in message and "\n" not in message
    assert call(service, "POST", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"n": 2}}).status == 200


@pytest.mark.parametrize("method, path, body, status, words", [
    ("POST", "/recommend", {"history": [1], "exclude": [10**9]}, 422, "exclude"),
    ("POST", "/recommend", {"history": [1], "allow": [10**9]}, 422, "allow"),
    ("POST", "/recommend", {"history": [1], "k": 17}, 400, "k: 17 is out of range 1…16"),
    ("POST", "/recommend", {"history": [999]}, 400, "history[0]: 999 is not a token id"),
    # the history is token ids here: its messages say so (they spoke of item ids)
    ("POST", "/recommend", {"history": []}, 400, "history: give at least one token id"),
    ("POST", "/recommend", {"k": 3}, 400, "history: required (a list of token ids, oldest first)"),
    ("POST", "/recommend", {"history": "1 2"}, 400, "history: expected a list of token ids, got str"),
    ("POST", "/recommend", {"history": [1, 2.5]}, 400, "history[1]: token id 2.5 is not an integer"),
    ("POST", "/recommend", {"history": [2**70]}, 400, "history[0]: token id 1180591620717411303424 is outside"),
    ("POST", "/recommend", {"history": [1], "keep_history": True}, 400, "keep_history"),
    ("GET", "/generate", None, 405, "use POST /generate"),
    ("POST", "/ready", None, 405, "no route POST /ready"),
    ("GET", "/nowhere", None, 404, "no route GET /nowhere"),
])
def test_other_bad_requests(service, method, path, body, status, words):
    reply = call(service, method, path, body)
    assert reply.status == status and words in reply.json()["error"], reply.body


def test_a_body_over_the_limit_gets_a_413_and_serving_goes_on(service):
    from zerogr_core.serve.schema import MAX_BODY_BYTES

    for path in ("/generate", "/recommend"):
        reply = call(service, "POST", path, b" " * MAX_BODY_BYTES + b'{"input_ids": [1]}')
        assert reply.status == 413 and reply.json()["error"] == \
            f"body: {MAX_BODY_BYTES + 18} bytes, at most {MAX_BODY_BYTES} bytes (8 MiB) a request"
    assert call(service, "POST", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"n": 2}}).status == 200


def test_the_ray_deployment_streams_the_body_and_refuses_it_past_the_limit(service):
    pytest.importorskip("ray.serve")
    from starlette.requests import Request

    from zerogr_core.serve import app
    from zerogr_core.serve.schema import MAX_BODY_BYTES

    cls = app.LLMDeployment.func_or_class
    dep = cls.__new__(cls)  # __init__ would load a second model
    dep.service = service

    def request(chunks, content_length, read):
        left = list(chunks)

        async def receive():
            read.append(1)
            return {"type": "http.request", "body": left.pop(0), "more_body": bool(left)}

        headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
        return Request({"type": "http", "method": "POST", "path": "/generate", "headers": headers,
                        "query_string": b""}, receive)

    good = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"n": 2}}).encode()
    declared, streamed = [], []
    for chunks, length, read in (([good], MAX_BODY_BYTES + 1, declared), ([b" " * 2**20] * 20, None, streamed)):
        response = asyncio.run(dep(request(chunks, length, read)))
        assert response.status_code == 413 and "at most 8388608 bytes (8 MiB)" in json.loads(response.body)["error"]
    assert declared == [] and len(streamed) == 9  # never read / read until it passed 8 MiB
    response = asyncio.run(dep(request([good[:5], good[5:]], len(good), [])))
    assert response.status_code == 200 and len(json.loads(response.body)["beam_results"]) == 2


def test_recommend_takes_string_item_ids_of_a_string_id_catalog(tmp_path):
    rng = np.random.default_rng(0)
    codes = rng.choice(64 ** 3, 300, replace=False)
    path = tmp_path / "items.csv"
    path.write_text("item_id,s1,s2,s3\n" + "".join(f"sku-{i},{c // 4096},{c // 64 % 64},{c % 64}\n"
                                                   for i, c in enumerate(codes)))
    svc = LLMService(LLMServeConfig.preset("tiny", catalog=str(path), warmup_context=0))
    svc.wait_ready(300)
    # exclude and allow hold the catalog's (string) item ids; the history stays token ids
    reply = call(svc, "POST", "/recommend", {"history": [1, 2, 3], "k": 16, "allow": ["sku-1", "sku-2", "sku-3"],
                                             "exclude": ["sku-2"]})
    assert reply.status == 200, reply.body
    assert sorted(reply.json()["items"]) == ["sku-1", "sku-3"]
    reply = call(svc, "POST", "/recommend", {"history": [1], "exclude": [5]})
    assert reply.status == 400 and "exclude[0]: item id 5 is not a string (this catalog has string ids)" in \
        reply.json()["error"]
    reply = call(svc, "POST", "/recommend", {"history": ["sku-1"]})
    assert reply.status == 400 and reply.json()["error"] == "history[0]: token id 'sku-1' is not an integer"


def _metric(text, name, labels=""):
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_prometheus_metrics_count_requests_latency_errors(service):
    def scrape():
        reply = call(service, "GET", "/metrics")
        assert reply.status == 200 and reply.content_type.startswith("text/plain")
        return reply.body.decode()

    before = scrape()
    for c in contexts(3, seed=4):
        assert call(service, "POST", "/generate", {"input_ids": c}).status == 200
    assert call(service, "POST", "/generate", {"input_ids": []}).status == 400
    assert call(service, "GET", "/nowhere").status == 404
    after = scrape()

    def grew(name, labels=""):
        return _metric(after, name, labels) - _metric(before, name, labels)

    # the scrape before is itself answered (200) once it is rendered
    assert grew("zerogr_requests_total", '{status="200"}') == 4
    assert grew("zerogr_requests_total", '{status="400"}') == 1
    assert grew("zerogr_requests_total", '{status="404"}') == 1
    assert grew("zerogr_errors_total") == 2
    assert grew("zerogr_request_latency_ms_count") == 3 and grew("zerogr_request_latency_ms_sum") > 0
    assert _metric(after, "zerogr_request_latency_ms_bucket", '{le="+Inf"}') == \
        _metric(after, "zerogr_request_latency_ms_count")
    assert _metric(after, "zerogr_in_flight") == 1  # the scrape itself
    assert _metric(after, "zerogr_queue_length") == 0
    snap = call(service, "GET", "/metrics", query="format=json").json()
    assert snap["responses"]["400"] >= 1 and snap["in_flight"] == 1


def test_a_client_that_goes_away_while_waiting_does_not_stop_the_server(service, monkeypatch):
    gate, decode = threading.Event(), service.rec.decode
    monkeypatch.setattr(service.rec, "decode", lambda queries: gate.wait(30) and decode(queries))
    body = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"n": 2}}).encode()

    async def scenario():
        first = asyncio.create_task(service.handle("POST", "/generate", "", body))
        await asyncio.sleep(0.3)  # the first is decoding (held at the gate)
        gone = asyncio.create_task(service.handle("POST", "/generate", "", body))
        await asyncio.sleep(0.1)
        gone.cancel()  # its client disconnected (or timed out) while it waited for a batch
        gate.set()
        assert (await first).status == 200
        with pytest.raises(asyncio.CancelledError):
            await gone
        # the batcher's worker died setting the cancelled request's result: every later request hung
        return await asyncio.wait_for(service.handle("POST", "/generate", "", body), 60)

    closed = _metric(call(service, "GET", "/metrics").body.decode(), "zerogr_requests_total", '{status="499"}')
    assert asyncio.run(scenario()).status == 200
    assert call(service, "GET", "/metrics", query="format=json").json()["queue_length"] == 0
    # the cancelled request is counted, under nginx's 499 (client closed request)
    text = call(service, "GET", "/metrics").body.decode()
    assert _metric(text, "zerogr_requests_total", '{status="499"}') == closed + 1
    assert "499: the client went away first" in text


def test_ready_is_503_until_loaded_and_warmed(monkeypatch):
    gate = threading.Event()
    warmup = LLMRecommender.warmup

    def held(self):
        gate.wait(60)
        warmup(self)

    monkeypatch.setattr(LLMRecommender, "warmup", held)
    svc = LLMService(LLMServeConfig.preset("tiny", batch_sizes=(1,)))
    reply = call(svc, "GET", "/ready")
    assert reply.status == 503 and reply.json() == {"status": "loading"}
    reply = call(svc, "POST", "/generate", {"input_ids": [1, 2]})
    assert reply.status == 503 and "loading" in reply.json()["error"]
    assert call(svc, "GET", "/health").json()["status"] == "loading"
    gate.set()
    svc.wait_ready(120)
    assert call(svc, "GET", "/ready").status == 200
    assert call(svc, "POST", "/generate", {"input_ids": [1, 2]}).status == 200
    health = call(svc, "GET", "/health").json()
    assert health["weights"] == "random" and health["items"] == 2000 and health["status"] == "ready"


def test_a_model_that_does_not_load_stays_503_with_the_reason():
    svc = LLMService(LLMServeConfig.preset("tiny", catalog="synth:watch-like:100:0:500"))
    with pytest.raises(ZeroGRError, match="do not fit the model's SID bands"):
        svc.wait_ready(120)
    reply = call(svc, "GET", "/ready")
    assert reply.status == 503 and reply.json()["status"] == "failed" and "SID bands" in reply.json()["error"]
    assert call(svc, "POST", "/generate", {"input_ids": [1]}).status == 503


def test_config_presets_and_checks():
    big = LLMServeConfig.preset("qwen3-1.7b")
    assert big.beam == 256 and big.dtype == "bfloat16" and big.weights == "random" and big.max_context >= 5000
    assert LLMServeConfig.from_dict(json.loads(json.dumps(CONFIG.to_dict()))) == CONFIG
    for bad, words in [(dict(model="gpt"), "model"), (dict(beam=0), "beam"), (dict(batch_sizes=()), "batch_sizes"),
                       (dict(checkpoint="/x"), "token_offsets"), (dict(dtype="int8"), "dtype"),
                       (dict(warmup_context=5000), "warmup_context"),
                       (dict(projections="int4"), "^projections: expected model or fp8, got 'int4'$"),
                       (dict(projections="fp8"), "^projections: fp8 needs a bfloat16 model, got float32$"),
                       (dict(partial_last_step="no"), "^partial_last_step: expected True or False, got 'no'$")]:
        with pytest.raises(ZeroGRError, match=words):
            LLMServeConfig.preset("tiny", **bad)


def test_a_replica_without_the_partial_last_step_serves_and_says_so():
    """``partial_last_step=False`` reaches every planned size's step model, /health reports it, and
    /generate answers with the items a replica with it (the default) returns."""
    answers = {}
    for partial in (True, False):
        svc = LLMService(LLMServeConfig.preset("tiny", batch_sizes=(1,), partial_last_step=partial))
        svc.wait_ready(120)
        assert all(s.step_model.partial_last_step is partial for s in svc.rec.servings.values())
        assert call(svc, "GET", "/health").json()["partial_last_step"] is partial
        reply = call(svc, "POST", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"n": 4}})
        assert reply.status == 200
        answers[partial] = [b["item"] for b in reply.json()["beam_results"]]
    assert answers[True] == answers[False] and len(answers[True]) == 4


def test_an_fp8_replica_serves_and_says_so():
    """A bfloat16 replica with FP8 projections answers /generate with catalog items and reports its
    projections in /health."""
    svc = LLMService(LLMServeConfig.preset("tiny", dtype="bfloat16", projections="fp8", batch_sizes=(1,)))
    svc.wait_ready(120)
    rec = svc.rec
    assert all(s.step_model.fp8 is not None for s in rec.servings.values())
    reply = call(svc, "POST", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"n": 4}})
    assert reply.status == 200
    items = [b["item"] for b in reply.json()["beam_results"]]
    assert len(items) == 4 and (rec.catalog.rows_of(items) >= 0).all()
    assert call(svc, "GET", "/health").json()["projections"] == "fp8"


def test_config_takes_whole_numbers_and_refuses_the_rest():
    """A configuration from JSON or Python: whole numbers as given (8.0, numpy integers) are taken as
    ints; a fraction was truncated (token offset 64.7 read as 64, so the SID tokens were fed back one id
    off) or let through (a warm-up context of 16.5), and a bare number as offsets raised TypeError."""
    got = LLMServeConfig.preset("tiny", beam=8.0, batch_sizes=(np.int64(2), 1), context_bucket=16.0,
                                warmup_context=np.int32(16), seed=3.0, token_offsets=(64.0, 128, 192))
    assert (got.beam, got.batch_sizes, got.context_bucket, got.warmup_context, got.seed) == (8, (1, 2), 16, 16, 3)
    assert got.token_offsets == (64, 128, 192) and all(type(v) is int for v in (got.beam, *got.batch_sizes))
    for bad, words in [(dict(token_offsets=(64.7, 128, 192)), r"^token_offsets: expected non-negative whole "),
                       (dict(token_offsets=5), r"^token_offsets: "),
                       (dict(token_offsets=(-1, 2, 3)), r"^token_offsets"),
                       (dict(beam=2.5), r"^beam: expected a positive integer, got 2\.5$"), (dict(beam=True), r"^beam"),
                       (dict(batch_sizes=(1, 2.5)), r"^batch_sizes"), (dict(warmup_context=16.5), r"^warmup_context"),
                       (dict(batch_wait_s="x"), r"^batch_wait_s"), (dict(seed=1.5), r"^seed"),
                       (dict(seed=2**40), r"^seed")]:
        with pytest.raises(ZeroGRError, match=words):
            LLMServeConfig.preset("tiny", **bad)


@pytest.mark.parametrize("argv, words", [
    (["serve", "--llm", "gpt-9"], "--llm gpt-9: unknown LLM serve preset"),
    (["serve", "--llm", "tiny", "--preset", "cpu"], "--preset: not used with --llm"),
    (["serve", "--llm", "tiny", "--checkpoint", "/nonexistent"], "token_offsets"),
    (["serve", "--llm", "tiny", "--checkpoint", "/nonexistent", "--token-offsets", "64,128,192"], "no such folder"),
    (["serve", "--token-offsets", "1,2,3"], "only with --llm"),
    (["serve", "--projections", "fp8"], "--projections: only with --llm"),
    (["serve", "--llm", "tiny", "--projections", "fp8"], "--llm tiny: projections: fp8 needs a bfloat16 model"),
    (["serve", "--no-partial-last-step"], "--no-partial-last-step: only with --llm"),
])
def test_serve_llm_cli_errors_are_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_serve_llm_refuses_a_bad_catalog_before_it_starts(tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a port free now, so the catalog is what is refused
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    (tmp_path / "bad.csv").write_text("item_id,s1\n1,x\n")
    for spec, words in ((str(tmp_path / "none.csv"), "no such file"),
                        (str(tmp_path / "bad.csv"), "row 1, column 's1'")):
        assert main(["serve", "--llm", "tiny", "--catalog", spec, "--port", port]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: --catalog: ") and words in err and len(err.strip().splitlines()) == 1, err


def test_load_test_quick(tmp_path):
    from zerogr_core.serve.llm_load_test import LOAD_PRESETS, run

    doc = run(LOAD_PRESETS["quick"], tmp_path, "test", log=lambda *_: None)
    r = doc["result"]
    assert r["requests"] == 16 and r["failed"] == 0 and r["invalid_items"] == 0 and r["throughput_rps"] > 0
    assert r["p50_ms"] <= r["p99_ms"] and sum(int(k) * v for k, v in r["batch_sizes"].items()) == 16
    saved = json.loads((tmp_path / "serve_llm.json").read_text())
    assert saved["machine"]["torch"] == torch.__version__ and saved["model"]["weights"] == "random"
    assert "| 40 | 16 | 16 | 4 |" in (tmp_path / "serve_llm.md").read_text()


def test_invalid_items_are_counted():
    from zerogr_core.serve.llm_load_test import invalid_items
    from zerogr_core.serve.llm_service import Reply

    class Rec:
        offsets = (64, 128, 192)

        def __init__(self, catalog):
            self.catalog = catalog

    from zerogr_core.catalog.samples import open_catalog

    rec = Rec(open_catalog(CONFIG.catalog))
    sid = rec.catalog.sids[5].astype(np.int64)
    good = dict(item=int(rec.catalog.item_ids[5]), sid=sid.tolist(), output_ids=(sid + 64 * np.arange(1, 4)).tolist())
    wrong_sid = dict(good, sid=[0, 0, 0])
    missing = dict(good, item=10**9)
    reply = Reply(200, json.dumps({"beam_results": [good, wrong_sid, missing]}).encode())
    assert invalid_items(rec, reply, 3) == 2 and invalid_items(rec, reply, 5) == 4
