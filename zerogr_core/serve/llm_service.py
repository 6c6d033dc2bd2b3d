"""The Qwen3 recommender's HTTP routes, independent of the web server that carries them.

:class:`LLMService` answers ``(method, path, query string, body)`` with a :class:`Reply`:

* ``POST /generate`` - SGLang-compatible (:mod:`.generate`), ``beam_results`` per input;
* ``POST /recommend`` - ``{"history": [token ids], "k": 10, "exclude": [item ids], "allow": [item ids]}``;
* ``GET /ready`` - 200 once the model is loaded and every planned batch size warmed, 503 before
  (and 503 with the error if loading failed);
* ``GET /health`` - the model, weights (``random`` for a preset shape), catalog and device;
* ``GET /metrics`` - Prometheus text (``?format=json``: the same figures as JSON).

The model loads in a background thread, so the routes answer (``/ready`` 503) meanwhile.
Every decode goes through one :class:`~.batching.Batcher`, and each gathered batch is padded
to a planned size by :class:`~.llm.LLMRecommender`. The Ray deployment
(:class:`~.app.LLMDeployment`) and the in-process load test
(:mod:`zerogr_core.serve.llm_load_test`) both call :meth:`LLMService.handle`.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass

from ..errors import first_line
from .batching import Batcher, padded_size
from .generate import beam_results, parse_generate, parse_recommend
from .llm import LLMRecommender, LLMServeConfig
from .metrics import CLIENT_CLOSED, ServeMetrics
from .schema import RequestError, check_body_size

JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
ROUTES = "POST /generate, POST /recommend, GET /ready, GET /health, GET /metrics"


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status, body bytes and content type."""

    status: int
    body: bytes
    content_type: str = JSON

    def json(self):
        return json.loads(self.body)


def _reply(doc, status: int = 200) -> Reply:
    return Reply(status, json.dumps(doc).encode())


def _error(status: int, message) -> Reply:
    return _reply({"error": " ".join(str(message).split())}, status)


class LLMService:
    """One replica's routes over an :class:`LLMRecommender` loaded in the background.

    Parameters
    ----------
    config : LLMServeConfig
    exporter : object, optional
        Passed to :class:`~.metrics.ServeMetrics` (the Ray deployment's Ray metrics).
    """

    def __init__(self, config: LLMServeConfig, exporter=None):
        self.config = config
        self.metrics = ServeMetrics(exporter)
        self.rec: LLMRecommender | None = None
        self.load_error: str | None = None
        self.load_s: float | None = None
        self._loaded = threading.Event()
        self.batcher = Batcher(self._decode, config.max_batch, config.batch_wait_s, on_batch=self._batch,
                               on_cancel=self.metrics.cancelled)
        threading.Thread(target=self._load, name="zerogr-llm-load", daemon=True).start()

    # ------------------------------------------------------------------ loading
    def _load(self) -> None:
        start = time.perf_counter()
        try:
            rec = LLMRecommender(self.config)
            rec.warmup()
            self.rec = rec
        except Exception as err:  # noqa: BLE001 - reported by /ready and wait_ready, one line
            self.load_error = f"{type(err).__name__}: {first_line(err)}"
        self.load_s = time.perf_counter() - start
        self._loaded.set()

    @property
    def ready(self) -> bool:
        return self.rec is not None

    def wait_ready(self, timeout: float | None = None) -> LLMRecommender:
        """Block until loaded and warmed; the recommender.

        Raises
        ------
        ZeroGRError
            Loading failed, or did not finish within ``timeout`` seconds.
        """
        from ..errors import ZeroGRError

        if not self._loaded.wait(timeout):
            raise ZeroGRError(f"the model did not load within {timeout} s")
        if self.rec is None:
            raise ZeroGRError(f"the model did not load: {self.load_error}")
        return self.rec

    # ------------------------------------------------------------------ batching
    def _batch(self, size: int) -> None:
        self.metrics.batch(size, padded_size(min(size, self.config.max_batch), self.config.batch_sizes))

    def _decode(self, queries: list) -> list:
        return self.rec.decode(queries)

    async def _submit(self, query):
        self.metrics.enqueue()
        answer = await self.batcher.submit(query)
        if isinstance(answer, RequestError):
            raise answer
        return answer

    # ------------------------------------------------------------------ routes
    async def handle(self, method: str, path: str, query: str = "", body=b"") -> Reply:
        """Answer one HTTP request (never raises: a failure is a 4xx/5xx :class:`Reply`; a request cancelled
        because its client went away is counted as status 499 and its ``CancelledError`` passed on).

        Parameters
        ----------
        method, path, query : str
        body : bytes or callable
            The body, or an async function returning it (a web server's reader, called only for a route that
            takes a body; it may raise a 413 :class:`RequestError`). A body over
            :data:`~.schema.MAX_BODY_BYTES` gets a 413.
        """
        start = time.perf_counter()
        self.metrics.begin()
        try:
            reply = await self._route(method.upper(), path.rstrip("/") or "/", query, body)
        except RequestError as err:
            reply = _error(err.status, err)
        except Exception as err:  # noqa: BLE001 - one request fails, the server keeps serving
            reply = _error(500, f"internal error: {type(err).__name__}: {first_line(err)}")
        except asyncio.CancelledError:  # its client went away (disconnected, timed out): no answer to send
            self.metrics.answered(CLIENT_CLOSED)
            raise
        finally:
            self.metrics.end()
        decoded = path.rstrip("/") in ("/generate", "/recommend")
        self.metrics.answered(reply.status, (time.perf_counter() - start) * 1e3
                              if decoded and reply.status == 200 else None)
        return reply

    async def _route(self, method: str, path: str, query: str, body) -> Reply:
        if path in ("/generate", "/recommend"):
            if method != "POST":
                return _error(405, f"use POST {path}")
            if self.rec is None:
                return _error(503, "the model is loading (GET /ready answers 200 when it serves)"
                              if self.load_error is None else f"the model did not load: {self.load_error}")
            body = await body() if callable(body) else body
            check_body_size(len(body))
            return await (self._generate(body) if path == "/generate" else self._recommend(body))
        if method != "GET":
            return _error(405 if path in ("/ready", "/health", "/metrics") else 404,
                          f"no route {method} {path} ({ROUTES})")
        if path == "/ready":
            if self.rec is not None:
                return _reply(dict(status="ready", load_s=round(self.load_s, 2)))
            if self.load_error is not None:
                return _reply(dict(status="failed", error=self.load_error), 503)
            return _reply(dict(status="loading"), 503)
        if path == "/health":
            doc = dict(status="ready" if self.rec is not None else "loading", config=self.config.to_dict())
            if self.rec is not None:
                doc.update(self.rec.describe())
            return _reply(doc)
        if path == "/metrics":
            if "format=json" in query.split("&"):
                return _reply(self.metrics.snapshot())
            return Reply(200, self.metrics.prometheus().encode(), PROMETHEUS)
        return _error(404, f"no route {method} {path} ({ROUTES})")

    async def _generate(self, body: bytes) -> Reply:
        rec = self.rec
        queries, batched, rids = parse_generate(body, beam=self.config.beam, levels=rec.levels, vocab=rec.vocab,
                                               max_context=self.config.max_context)
        answers = await asyncio.gather(*(self._submit(q) for q in queries))
        docs = [beam_results(a, q, rec.levels, rid) for a, q, rid in zip(answers, queries, rids)]
        return _reply(docs if batched else docs[0])

    async def _recommend(self, body: bytes) -> Reply:
        rec = self.rec
        query = parse_recommend(body, beam=self.config.beam, vocab=rec.vocab, max_context=self.config.max_context,
                                string_ids=rec.catalog.string_ids)
        answer = await self._submit(query)
        return _reply(dict(items=answer.items, scores=answer.scores, sids=answer.codes.tolist()))
