"""The Qwen3 recommender behind Ray Serve's HTTP proxy (one CPU replica, tiny shape): /ready
turns 200 once loaded, /generate answers SGLang-style, /metrics is Prometheus text, and a
malformed request gets a one-line 4xx."""
import json
import os
import socket
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("ray.serve")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, body=None, method=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("content-type", ""), err.read()


@pytest.fixture(scope="module")
def url():
    from zerogr_core.serve import app
    from zerogr_core.serve.llm import LLMServeConfig

    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"  # reference ops in the replica
    port = free_port()
    try:
        app.start(LLMServeConfig.preset("tiny", batch_sizes=(1, 4)), replicas=1, port=port, num_cpus=2)
        yield f"http://127.0.0.1:{port}"
    finally:
        app.shutdown()
        os.environ["TRITON_INTERPRET"] = old if old is not None else ""


def test_generate_ready_and_metrics_over_http(url):
    deadline = time.monotonic() + 180
    while (status := call(url + "/ready")[0]) != 200 and time.monotonic() < deadline:
        assert status == 503
        time.sleep(0.5)
    assert status == 200
    status, _, body = call(url + "/generate", {"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"n": 4}})
    docs = json.loads(body)
    assert status == 200 and len(docs) == 2 and all(len(d["beam_results"]) == 4 for d in docs)
    status, _, body = call(url + "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 9}})
    assert status == 400 and "max_new_tokens: must be 3" in json.loads(body)["error"]
    status, kind, body = call(url + "/metrics")
    assert status == 200 and kind.startswith("text/plain")
    assert 'zerogr_requests_total{status="200"}' in body.decode() and "zerogr_in_flight 1" in body.decode()
