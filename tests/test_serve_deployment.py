"""The MovieLens Ray Serve deployment's request handling in-process, without a Ray cluster: its
``__call__`` and ``@serve.batch`` method on a stand-in recommender, fed starlette requests."""
import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve")

from starlette.requests import Request  # noqa: E402

from zerogr_core.serve.config import ServeConfig  # noqa: E402
from zerogr_core.serve.metrics import ServeMetrics  # noqa: E402
from zerogr_core.serve.schema import MAX_BODY_BYTES  # noqa: E402


def request(chunks, *, path="/recommend", method="POST", content_length=None, read=None):
    """A starlette request whose body arrives in ``chunks``; ``read`` counts the chunks received."""
    chunks = [c.encode() if isinstance(c, str) else c for c in chunks]
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    scope = {"type": "http", "method": method, "path": path, "headers": headers, "query_string": b""}
    left = list(chunks)

    async def receive():
        if not left:
            await asyncio.sleep(3600)  # the client stays connected
        if read is not None:
            read.append(len(left))
        return {"type": "http.request", "body": left.pop(0), "more_body": bool(left)}

    return Request(scope, receive)


class StandInRecommender:
    """Answers each history with its first id; holds every decode until ``gate`` opens."""

    catalog = SimpleNamespace(string_ids=False)

    def __init__(self):
        self.gate, self.decoding, self.batches = threading.Event(), threading.Event(), []

    def recommend(self, queries):
        self.batches.append([q.history for q in queries])
        self.decoding.set()
        self.gate.wait(30)
        return [SimpleNamespace(to_json=lambda q=q: {"items": [q.history[0]]}) for q in queries]


@pytest.fixture
def deployment(monkeypatch):
    from ray import serve

    from zerogr_core.serve import app

    cls = app.RecommenderDeployment.func_or_class
    # Serve's batch queue asks the replica context for max_ongoing_requests, and binds to the event loop
    # it is first used in: a fresh one per test
    monkeypatch.setattr(serve, "get_replica_context", lambda: SimpleNamespace(
        _deployment_config=SimpleNamespace(max_ongoing_requests=8)))
    monkeypatch.setattr(cls.recommend_batch._is_batching_task_alive.__self__, "_queue", None)
    dep = cls.__new__(cls)  # __init__ would load the model
    dep.config = ServeConfig(beam=8, batch_sizes=(1,), batch_wait_s=0.0)
    dep.rec, dep.metrics, dep.replica = StandInRecommender(), ServeMetrics(), "test"
    dep._decode_pool = ThreadPoolExecutor(1)
    dep.recommend_batch.set_max_batch_size(1)
    dep.recommend_batch.set_batch_wait_timeout_s(0.0)
    yield dep
    dep.rec.gate.set()
    dep._decode_pool.shutdown()


def answer(response):
    return response.status_code, json.loads(response.body)


def test_a_body_over_the_limit_gets_a_413_before_it_is_read_and_serving_goes_on(deployment):
    deployment.rec.gate.set()

    async def scenario():
        # declared too long: refused by its Content-Length, not one chunk read
        declared = await deployment(request(["x"], content_length=MAX_BODY_BYTES + 1, read=read_declared))
        # no Content-Length (chunked): refused once the stream passes the limit, the rest never read
        streamed = await deployment(request([b" " * 2**20] * 20, read=read_streamed))
        text = json.dumps({"history": [7, 8]})
        return declared, streamed, await deployment(request([text], content_length=len(text)))

    read_declared, read_streamed = [], []
    declared, streamed, good = asyncio.run(scenario())
    for response in (declared, streamed):
        status, doc = answer(response)
        assert status == 413 and f"at most {MAX_BODY_BYTES} bytes (8 MiB)" in doc["error"] and "\n" not in doc["error"]
    assert "body: 8388609 bytes" in answer(declared)[1]["error"]
    assert read_declared == [] and len(read_streamed) == 9  # 8 MiB and one more of the stream's 20 chunks
    assert answer(good) == (200, {"items": [7]})
    assert deployment.metrics.snapshot()["responses"] == {"200": 1, "413": 2}


def test_a_request_cancelled_while_it_waits_leaves_the_queue_gauge(deployment):
    queue = []
    deployment.metrics.exporter = SimpleNamespace(queue=queue.append, batch=lambda *a: None,
                                                  status=lambda *a: None, latency=lambda *a: None)
    rec = deployment.rec

    def call(history):
        text = json.dumps({"history": history})
        return asyncio.create_task(deployment(request([text], content_length=len(text))))

    async def scenario():
        first = call([1])
        while not rec.decoding.is_set():  # the first decodes (held at the gate); the next two wait behind it
            await asyncio.sleep(0.01)
        gone, kept = call([2]), call([3])
        await asyncio.sleep(0.1)
        assert deployment.metrics.snapshot()["queue_length"] == 2
        gone.cancel()  # its client went away while it waited: Serve drops it from its batch
        with pytest.raises(asyncio.CancelledError):
            await gone
        rec.gate.set()
        return await first, await kept

    first, kept = asyncio.run(scenario())
    assert answer(first) == (200, {"items": [1]}) and answer(kept) == (200, {"items": [3]})
    assert rec.batches == [[(1,)], [(3,)]]  # the cancelled request was never decoded
    # it was counted into the gauge and never out: the gauge crept up by one per cancelled request
    assert deployment.metrics.snapshot()["queue_length"] == 0 and queue[-1] == 0
    # and the cancelled request is counted, under nginx's 499 (client closed request)
    assert deployment.metrics.snapshot()["responses"] == {"200": 2, "499": 1}


def test_a_client_that_disconnects_while_sending_its_body_is_counted_as_499(deployment):
    async def receive():
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/recommend", "headers": [], "query_string": b""}
    response = asyncio.run(deployment(Request(scope, receive)))
    assert answer(response) == (499, {"error": "body: the client went away before sending all of it"})
    assert deployment.metrics.snapshot()["responses"] == {"499": 1}  # was a 500, an internal error
