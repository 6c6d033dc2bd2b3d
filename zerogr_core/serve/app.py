"""The Ray Serve deployments: ``POST /recommend``, ``GET /health``, ``GET /metrics``; and the
Qwen3 recommender's (:class:`LLMDeployment`: ``POST /generate`` SGLang-style, ``POST /recommend``,
``GET /ready``, ``GET /health``, Prometheus ``GET /metrics``; routes in :mod:`.llm_service`).

One replica per GPU (``ray_actor_options={"num_gpus": 1}``; one CPU each without GPUs),
each holding the model, the catalog's index and its decoder (:class:`~.recommender.Recommender`).
``@serve.batch`` gathers concurrent requests of a replica; the recommender pads each batch
to a planned size. Catalog versions arrive through ``reconfigure`` (the deployment's
``user_config``, a :class:`~.live.CatalogPush`), so every replica, including one started
later, serves the pushed state.

Metrics: Ray Serve's own (request counts and latency per deployment, queued and ongoing
requests) plus this deployment's ``zerogr_request_latency_ms``, ``zerogr_batch_size``,
``zerogr_padded_batch_size``, ``zerogr_queue_length`` and ``zerogr_responses`` (per status; 499: the
client went away first), recorded through
``ray.serve.metrics`` and exported by Ray with a ``ray_`` prefix on each node's Prometheus
endpoint (labelled per replica); ``GET /metrics`` returns the same figures of the replica
that answers, as JSON.

This module imports Ray: import it only to start or drive a server.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from ray import serve
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from .batching import padded_size
from .config import ServeConfig
from .live import CatalogPush
from .metrics import CLIENT_CLOSED, LATENCY_BUCKETS_MS, ServeMetrics
from .schema import MAX_BODY_BYTES, RequestError, parse_query, read_limited

APP_NAME = "zerogr"
DEPLOYMENT = "Recommender"
LLM_DEPLOYMENT = "LLMRecommender"


class RayMetrics:
    """Exporter of :class:`ServeMetrics` into ``ray.serve.metrics`` (Prometheus)."""

    def __init__(self, max_batch: int):
        from ray.serve import metrics

        sizes = [float(2 ** i) for i in range(max(1, max_batch.bit_length()) + 1)]
        self._latency = metrics.Histogram("zerogr_request_latency_ms", description="arrival at the replica to answer",
                                          boundaries=[float(b) for b in LATENCY_BUCKETS_MS])
        self._batch = metrics.Histogram("zerogr_batch_size", description="requests per gathered batch",
                                        boundaries=sizes)
        self._padded = metrics.Histogram("zerogr_padded_batch_size", description="planned size each batch ran at",
                                         boundaries=sizes)
        self._queue = metrics.Gauge("zerogr_queue_length", description="requests waiting for a batch")
        self._status = metrics.Counter("zerogr_responses", description="answers per HTTP status",
                                       tag_keys=("status",))

    def latency(self, ms):
        self._latency.observe(ms)

    def batch(self, size, padded):
        self._batch.observe(size)
        self._padded.observe(padded)

    def queue(self, length):
        self._queue.set(length)

    def status(self, code):
        self._status.inc(tags={"status": str(code)})


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status)


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """``request``'s body, streamed and refused (413, :class:`RequestError`) by its ``Content-Length`` or as soon
    as it passes ``limit`` bytes: ``request.body()`` would hold a body of any size in memory first. A client that
    disconnects before sending it all gets a 499 :class:`RequestError` (counted as such; nobody reads it)."""
    try:
        return await read_limited(request.headers.get("content-length"), request.stream(), limit)
    except ClientDisconnect:
        raise RequestError("body: the client went away before sending all of it", status=CLIENT_CLOSED) from None


class _Waiting:
    """A query waiting for a batch; ``taken`` once a batch holds it (else it is still counted as waiting)."""

    __slots__ = ("query", "taken")

    def __init__(self, query):
        self.query, self.taken = query, False


@serve.deployment(name=DEPLOYMENT)
class RecommenderDeployment:
    """One replica: a :class:`~.recommender.Recommender` behind HTTP, batching requests."""

    def __init__(self, config: dict):
        from .recommender import Recommender

        self.config = ServeConfig.from_dict(config)
        self.rec = Recommender(self.config)
        self.metrics = ServeMetrics(RayMetrics(self.config.max_batch))
        self.recommend_batch.set_max_batch_size(self.config.max_batch)
        self.recommend_batch.set_batch_wait_timeout_s(self.config.batch_wait_s)
        self._decode_pool = ThreadPoolExecutor(1, thread_name_prefix="zerogr-decode")
        self._push_pool = ThreadPoolExecutor(1, thread_name_prefix="zerogr-push")
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - only a label
            self.replica = "local"

    async def reconfigure(self, user_config: dict) -> None:
        """Serve a pushed catalog state; decoding goes on meanwhile (rebuilds run off to the side)."""
        push = CatalogPush.from_config(user_config)
        await asyncio.get_running_loop().run_in_executor(self._push_pool, self.rec.push, push)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def recommend_batch(self, waiting: list) -> list:
        for w in waiting:
            w.taken = True
        self.metrics.batch(len(waiting), padded_size(len(waiting), self.config.batch_sizes))
        return await asyncio.get_running_loop().run_in_executor(self._decode_pool, self.rec.recommend,
                                                                [w.query for w in waiting])

    async def __call__(self, request: Request) -> JSONResponse:
        start = time.perf_counter()
        path, method = request.url.path.rstrip("/") or "/", request.method
        if path == "/recommend":
            if method != "POST":
                return self._answer(_error(405, "use POST /recommend"))
            try:
                query = parse_query(await read_body(request), max_k=self.config.beam,
                                    string_ids=self.rec.catalog.string_ids)
                waiting = _Waiting(query)
                self.metrics.enqueue()
                try:
                    answer = await self.recommend_batch(waiting)
                finally:
                    # a request cancelled while it waits (its client went away) is dropped by @serve.batch
                    # without reaching recommend_batch, which counts the others out of the queue gauge
                    if not waiting.taken:
                        self.metrics.cancelled(1)
            except RequestError as err:
                return self._answer(_error(err.status, err))
            except Exception as err:  # noqa: BLE001 - one request fails, the server keeps serving
                return self._answer(_error(500, f"internal error: {type(err).__name__}: {err}"))
            except asyncio.CancelledError:  # its client went away (disconnected, timed out): no answer to send
                self.metrics.answered(CLIENT_CLOSED)
                raise
            if isinstance(answer, RequestError):
                return self._answer(_error(answer.status, answer))
            return self._answer(JSONResponse(answer.to_json()), (time.perf_counter() - start) * 1e3)
        if path == "/health" and method == "GET":
            current = self.rec.live.store.current
            return JSONResponse(dict(status="ok", catalog_version=self.rec.live.version, items=current.n_live,
                                     replica=self.replica, device=str(self.rec.device)))
        if path == "/metrics" and method == "GET":
            return JSONResponse(dict(self.metrics.snapshot(), replica=self.replica,
                                     catalog_version=self.rec.live.version))
        return self._answer(_error(404, f"no route {method} {path} (POST /recommend, GET /health, GET /metrics)"))

    def _answer(self, response: JSONResponse, latency_ms: float | None = None) -> JSONResponse:
        self.metrics.answered(response.status_code, latency_ms)
        return response


@serve.deployment(name=LLM_DEPLOYMENT)
class LLMDeployment:
    """One replica of the Qwen3 recommender: :class:`~.llm_service.LLMService` behind HTTP.

    The model loads in the background (``GET /ready`` answers 503 until it is warmed);
    requests are gathered by the service's :class:`~.batching.Batcher`, the same code the
    in-process load test drives."""

    def __init__(self, config: dict):
        from .llm import LLMServeConfig
        from .llm_service import LLMService

        cfg = LLMServeConfig.from_dict(config)
        self.service = LLMService(cfg, RayMetrics(cfg.max_batch))

    async def __call__(self, request: Request) -> Response:
        # the body is read (and its size checked) by the service, only for a route that takes one
        reply = await self.service.handle(request.method, request.url.path, request.url.query,
                                          lambda: read_body(request))
        return Response(reply.body, status_code=reply.status, media_type=reply.content_type)


def build_llm_app(config, *, replicas: int, gpus: bool):
    """The Qwen3 recommender's application (``config``: an :class:`~.llm.LLMServeConfig`)."""
    actor = {"num_gpus": 1} if gpus else {"num_cpus": 1}
    return LLMDeployment.options(num_replicas=replicas, ray_actor_options=actor,
                                 max_ongoing_requests=4 * config.max_batch).bind(config.to_dict())


def build_app(config: ServeConfig, *, replicas: int, gpus: bool, push: CatalogPush | None = None):
    """The application: ``replicas`` replicas of one GPU each (one CPU each when ``gpus`` is
    False), serving ``push`` (default: the configured catalog as version 1)."""
    actor = {"num_gpus": 1} if gpus else {"num_cpus": 1}
    push = push or CatalogPush(1)
    return RecommenderDeployment.options(
        num_replicas=replicas, ray_actor_options=actor, user_config=push.to_config(),
        # a full batch decoding and the next one gathering
        max_ongoing_requests=2 * config.max_batch,
        # Serve gives every serve.run a fresh code version, which restarts the replicas; a
        # version fixed by what the replicas are built from makes a push that only changes
        # user_config an in-place reconfigure (as `serve deploy` of a config file does)
        version=code_version(config, gpus), _internal=True,
    ).bind(config.to_dict())


def code_version(config: ServeConfig, gpus: bool) -> str:
    """What a replica is built from: its config, GPU or CPU, and this package's files."""
    import hashlib
    import json
    from pathlib import Path

    digest = hashlib.sha256(json.dumps([config.to_dict(), gpus], sort_keys=True).encode())
    for file in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def cluster_gpus() -> int:
    """GPUs of the Ray cluster this process is connected to."""
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def start(config, *, replicas: int | None = None, host: str = "127.0.0.1", port: int = 8000,
          address: str | None = None, push: CatalogPush | None = None, num_cpus: int | None = None):
    """Connect to (``address``) or start a local Ray cluster, start Serve's HTTP proxy on
    ``host:port`` and run the application (``config`` a :class:`ServeConfig`, or an
    :class:`~.llm.LLMServeConfig` for the Qwen3 recommender); returns ``(replicas, gpus)``.

    ``replicas`` defaults to the cluster's GPU count (one replica per GPU), else 1.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    gpus = cluster_gpus() > 0
    if replicas is None:
        replicas = max(1, cluster_gpus())
    serve.start(http_options={"host": host, "port": port})
    bound = build_app(config, replicas=replicas, gpus=gpus, push=push) if isinstance(config, ServeConfig) else \
        build_llm_app(config, replicas=replicas, gpus=gpus)
    serve.run(bound, name=APP_NAME, route_prefix="/")
    return replicas, gpus


def push_catalog(config: ServeConfig, push: CatalogPush, *, replicas: int, gpus: bool) -> None:
    """Push a catalog state to every replica of the running application (``reconfigure``;
    the replicas keep running and answer from the old version until the new one is published)."""
    serve.run(build_app(config, replicas=replicas, gpus=gpus, push=push), name=APP_NAME, route_prefix="/")


def shutdown() -> None:
    import ray

    serve.shutdown()
    ray.shutdown()
