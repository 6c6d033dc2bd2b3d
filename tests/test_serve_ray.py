"""The Ray Serve deployment end to end: a local Ray cluster, one CPU replica, HTTP requests
good and bad, concurrent requests gathered into batches, and a catalog push applied in place."""
import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

from zerogr_core.recsys import movielens

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.skipif(not movielens.available(), reason="the bundled MovieLens model is not there")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, body=None, method=None):
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def server():
    import os

    from zerogr_core.serve import app
    from zerogr_core.serve.config import ServeConfig

    # reference ops in the replica (the interpreter would take minutes)
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    config = ServeConfig(beam=8, batch_sizes=(1, 4), engine="reference", batch_wait_s=0.05)
    port = free_port()
    try:
        app.start(config, replicas=1, port=port, num_cpus=2)
        yield app, config, f"http://127.0.0.1:{port}"
    finally:
        app.shutdown()
        os.environ["TRITON_INTERPRET"] = old if old is not None else ""


def test_recommend_health_metrics_and_4xx(server):
    _, _, url = server
    status, health = call(url + "/health")
    assert status == 200 and health["status"] == "ok" and health["catalog_version"] == 1
    status, answer = call(url + "/recommend", '{"history": [1, 2, 3], "k": 3}')
    assert status == 200 and len(answer["items"]) == 3 and answer["catalog_version"] == 1
    assert not {1, 2, 3} & set(answer["items"]) and answer["scores"] == sorted(answer["scores"], reverse=True)
    for body, code, words in [('{"history": [1, 2', 400, "not valid JSON"), ('{"history": [424242424], "k": 3}', 422,
                              "item id 424242424"), ('{"history": [1], "k": 9}', 400, "out of range 1…8")]:
        status, err = call(url + "/recommend", body)
        assert status == code and words in err["error"], (body, err)
    assert call(url + "/recommend", method="GET")[0] == 405
    assert call(url + "/nowhere")[0] == 404
    # the server kept serving; concurrent requests are all answered
    results = [None] * 8

    def one(i):
        results[i] = call(url + "/recommend", json.dumps({"history": [1 + i, 50], "k": 4}))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r[0] == 200 and len(r[1]["items"]) == 4 for r in results)
    status, metrics = call(url + "/metrics")
    assert status == 200 and metrics["responses"]["200"] >= 9 and metrics["responses"]["422"] == 1
    assert sum(int(k) * v for k, v in metrics["batch_sizes"].items()) >= 10
    assert set(metrics["padded_batch_sizes"]) <= {"1", "4"} and metrics["latency_ms"]["count"] >= 9


def test_a_catalog_push_reconfigures_the_running_replica(server):
    app, config, url = server
    from zerogr_core.serve.live import CatalogPush

    _, before = call(url + "/health")
    _, answer = call(url + "/recommend", '{"history": [1, 2, 3], "k": 3}')
    app.push_catalog(config, CatalogPush(7, deleted=[answer["items"][0]]), replicas=1, gpus=False)
    _, after = call(url + "/health")
    assert after["catalog_version"] == 7 and after["replica"] == before["replica"]  # in place, no restart
    assert after["items"] == before["items"] - 1
    status, again = call(url + "/recommend", '{"history": [1, 2, 3], "k": 3}')
    assert status == 200 and again["catalog_version"] == 7 and answer["items"][0] not in again["items"]
