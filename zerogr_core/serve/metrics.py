"""What a replica measures: request latency, batch sizes, queue length.

:class:`ServeMetrics` keeps the figures in the replica (``GET /metrics`` returns them for
the replica that answers) and mirrors each observation to an optional *exporter*; the
Ray deployment passes one that records Ray's own metrics (``ray.serve.metrics``), which
Ray's Prometheus endpoint aggregates over every replica.
"""
from __future__ import annotations

import bisect
import threading
from collections import Counter

#: The status a request is counted under when its client went away before its answer (disconnected, or timed out
#: and cancelled it): nginx's "client closed request", so a dashboard of statuses shows them beside the answers.
CLIENT_CLOSED = 499
#: Upper bounds (ms) of the latency histogram's buckets; the last bucket is open.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class Histogram:
    """Counts per bucket of fixed upper bounds, with the sum (Prometheus-style)."""

    def __init__(self, bounds=LATENCY_BUCKETS_MS):
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding quantile ``q`` (``inf`` for the open bucket)."""
        if not self.n:
            return None
        rank, seen = q * self.n, 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return self.bounds[i] if i < len(self.bounds) else float("inf")
        return float("inf")

    def to_dict(self) -> dict:
        buckets = {f"le_{b:g}": c for b, c in zip(self.bounds, self.counts)}
        buckets["le_inf"] = self.counts[-1]
        return dict(count=self.n, sum=round(self.total, 3), buckets=buckets,
                    p50_bucket=self.quantile(0.5), p99_bucket=self.quantile(0.99))


class ServeMetrics:
    """A replica's request latency (ms, arrival to answer), batch sizes (gathered and
    padded), requests waiting for a batch, and answers per HTTP status (:data:`CLIENT_CLOSED`,
    499, for a request whose client went away first).

    Parameters
    ----------
    exporter : object, optional
        Told of every observation: ``latency(ms)``, ``batch(size, padded)``,
        ``queue(length)``, ``status(code)``.
    """

    def __init__(self, exporter=None):
        self.exporter = exporter
        self._lock = threading.Lock()
        self.latency = Histogram()
        self.batch_sizes: Counter = Counter()
        self.padded_sizes: Counter = Counter()
        self.statuses: Counter = Counter()
        self.waiting = 0
        self.in_flight = 0

    def begin(self) -> None:
        """A request arrived (in flight until :meth:`end`)."""
        with self._lock:
            self.in_flight += 1

    def end(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def enqueue(self) -> None:
        with self._lock:
            self.waiting += 1
            waiting = self.waiting
        self._export("queue", waiting)

    def batch(self, size: int, padded: int) -> None:
        """A batch of ``size`` waiting requests starts decoding at ``padded`` rows."""
        with self._lock:
            self.waiting -= size
            waiting = self.waiting
            self.batch_sizes[size] += 1
            self.padded_sizes[padded] += 1
        self._export("batch", size, padded)
        self._export("queue", waiting)

    def cancelled(self, count: int) -> None:
        """``count`` waiting requests left the queue without a batch (their clients went away)."""
        with self._lock:
            self.waiting -= count
            waiting = self.waiting
        self._export("queue", waiting)

    def answered(self, status: int, latency_ms: float | None = None) -> None:
        with self._lock:
            self.statuses[status] += 1
            if latency_ms is not None:
                self.latency.observe(latency_ms)
        self._export("status", status)
        if latency_ms is not None:
            self._export("latency", latency_ms)

    def snapshot(self) -> dict:
        with self._lock:
            return dict(latency_ms=self.latency.to_dict(), queue_length=self.waiting, in_flight=self.in_flight,
                        batch_sizes={str(k): v for k, v in sorted(self.batch_sizes.items())},
                        padded_batch_sizes={str(k): v for k, v in sorted(self.padded_sizes.items())},
                        responses={str(k): v for k, v in sorted(self.statuses.items())})

    def prometheus(self, prefix: str = "zerogr") -> str:
        """The figures in Prometheus' text format: ``{prefix}_requests_total`` per status (499: the
        client went away first), ``{prefix}_errors_total`` (status ≥ 400, 499 included),
        ``{prefix}_request_latency_ms`` (a cumulative histogram of the answered requests),
        ``{prefix}_in_flight``, ``{prefix}_queue_length`` and ``{prefix}_batches_total`` per gathered size."""
        with self._lock:
            statuses, lat = dict(self.statuses), self.latency
            counts, total, n = list(lat.counts), lat.total, lat.n
            in_flight, waiting, batches = self.in_flight, self.waiting, dict(self.batch_sizes)
        lines = [f"# HELP {prefix}_requests_total Requests per HTTP status (499: the client went away first).",
                 f"# TYPE {prefix}_requests_total counter"]
        lines += [f'{prefix}_requests_total{{status="{k}"}} {v}' for k, v in sorted(statuses.items())]
        errors = sum(v for k, v in statuses.items() if int(k) >= 400)
        lines += [f"# HELP {prefix}_errors_total Requests answered with a 4xx or 5xx status, or given up (499).",
                  f"# TYPE {prefix}_errors_total counter", f"{prefix}_errors_total {errors}",
                  f"# HELP {prefix}_request_latency_ms Arrival to answer of the successful requests, ms.",
                  f"# TYPE {prefix}_request_latency_ms histogram"]
        seen = 0
        for bound, c in zip(lat.bounds, counts):
            seen += c
            lines.append(f'{prefix}_request_latency_ms_bucket{{le="{bound:g}"}} {seen}')
        lines += [f'{prefix}_request_latency_ms_bucket{{le="+Inf"}} {n}',
                  f"{prefix}_request_latency_ms_sum {total:.3f}", f"{prefix}_request_latency_ms_count {n}",
                  f"# HELP {prefix}_in_flight Requests received and not yet answered.",
                  f"# TYPE {prefix}_in_flight gauge", f"{prefix}_in_flight {in_flight}",
                  f"# HELP {prefix}_queue_length Requests waiting for a batch.",
                  f"# TYPE {prefix}_queue_length gauge", f"{prefix}_queue_length {waiting}",
                  f"# HELP {prefix}_batches_total Gathered batches per size.",
                  f"# TYPE {prefix}_batches_total counter"]
        lines += [f'{prefix}_batches_total{{size="{k}"}} {v}' for k, v in sorted(batches.items())]
        return "\n".join(lines) + "\n"

    def _export(self, what: str, *values) -> None:
        if self.exporter is not None:
            getattr(self.exporter, what)(*values)
