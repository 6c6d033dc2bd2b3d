"""Load test of the Ray Serve deployment on a local Ray cluster.

N clients (threads, one keep-alive HTTP connection each) send ``POST /recommend`` with the
histories of the bundled MovieLens test users for a fixed time, back to back, and the run
records every latency and status. Phases:

1. ``replicas-1`` and ``replicas-2``: steady load on one, then two replicas (the replica
   count changes in place), the measured points of throughput against replicas;
2. ``push``: the same load on two replicas while catalog versions are pushed (each deletes
   items; ``reconfigure`` applies it on every replica). Every answer must come back 200,
   and no answer labelled with a version may hold an item that version deleted.

The result (machine, settings, per phase p50/p90/p99, throughput, failures, pushes) goes
to ``runs/results/serve/load-<host>.json``::

    python -m zerogr_core.serve.load_test                      # defaults: 8 clients, 20 s per phase
    python -m zerogr_core.serve.load_test --clients 16 --seconds 30 --replicas 1,2,4 --gpu   # on a GPU host

A figure of this file is only as good as the machine: on a shared 2-core CPU box the
replicas compete with the clients and the proxy for the same cores.
"""
from __future__ import annotations

import http.client
import json
import os
import platform
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..arg_types import seconds, whole, wholes
from ..errors import Parser, UsageError

ROOT = Path(__file__).resolve().parents[2]

FORMAT = "zerogr-serve-load-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client(threading.Thread):
    """Sends requests back to back until ``stop``; records (start, latency ms, status, body)."""

    def __init__(self, port: int, bodies: list, seed: int, stop: threading.Event):
        super().__init__(daemon=True)
        self.port, self.bodies, self.stop = port, bodies, stop
        self.rng = np.random.default_rng(seed)
        self.records: list = []

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        while not self.stop.is_set():
            body = self.bodies[int(self.rng.integers(len(self.bodies)))]
            start = time.perf_counter()
            try:
                conn.request("POST", "/recommend", body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                payload = resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                status, payload = 0, repr(err).encode()
            self.records.append((start, (time.perf_counter() - start) * 1e3, status, payload))
        conn.close()


def load(port: int, bodies: list, clients: int, seconds: float, during=None) -> tuple[list, float]:
    """Run ``clients`` clients for ``seconds``; ``during(t0)`` runs alongside (the pushes)."""
    stop = threading.Event()
    workers = [Client(port, bodies, seed, stop) for seed in range(clients)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    extra = None
    if during is not None:
        extra = threading.Thread(target=during, args=(t0, stop), daemon=True)
        extra.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    if extra is not None:
        extra.join()
    return [r for w in workers for r in w.records], t0


def request_summary(latencies_ms, statuses) -> dict:
    """Requests, failures (status other than 200), counts per status and latency percentiles
    (ms) of a load test; ``latencies_ms`` and ``statuses`` hold one entry per request."""
    lat = np.asarray(latencies_ms, dtype=float)
    counts: dict = {}
    for status in statuses:
        counts[str(status)] = counts.get(str(status), 0) + 1
    return dict(requests=len(lat), failed=sum(v for k, v in counts.items() if k != "200"), statuses=counts,
                p50_ms=round(float(np.percentile(lat, 50)), 2), p90_ms=round(float(np.percentile(lat, 90)), 2),
                p99_ms=round(float(np.percentile(lat, 99)), 2), mean_ms=round(float(lat.mean()), 2),
                max_ms=round(float(lat.max()), 2))


def summarise(name: str, records: list, seconds: float, clients: int, replicas: int) -> dict:
    summary = request_summary([r[1] for r in records], [r[2] for r in records])
    return dict(phase=name, replicas=replicas, clients=clients, seconds=seconds, **summary,
                throughput_rps=round(len(records) / seconds, 2))


def main(argv=None) -> int:
    p = Parser(prog="python -m zerogr_core.serve.load_test", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=whole(1), default=8)
    p.add_argument("--seconds", type=seconds(), default=20.0, help="per phase")
    p.add_argument("--replicas", type=wholes(1), default=[1, 2],
                   help="replica counts of the steady phases; the push phase runs on the last")
    p.add_argument("--pushes", type=whole(1), default=3, help="catalog versions pushed during the push phase")
    p.add_argument("--delete", type=whole(1), default=20, help="items each push deletes")
    p.add_argument("--k", type=whole(1), default=10)
    p.add_argument("--preset", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--gpu", action="store_true", help="one GPU per replica (default: one CPU each)")
    p.add_argument("--out", default=None, help="result file (default runs/results/serve/load-<host>.json)")
    try:
        args = p.parse_args(argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    replica_counts = args.replicas

    import ray
    import torch

    from ..environment import environment
    from ..recsys.movielens import bundled_study
    from . import app
    from .config import ServeConfig
    from .live import CatalogPush
    from .offline import movielens_users

    study = bundled_study("cpu")
    users = movielens_users(study)
    bodies = [json.dumps({"history": list(h), "k": args.k}).encode() for h in users.histories]
    config = ServeConfig.preset(args.preset)
    port = free_port()
    started = time.perf_counter()
    app.start(config, replicas=replica_counts[0], port=port, num_cpus=None if args.gpu else os.cpu_count())
    startup_s = time.perf_counter() - started
    print(f"serving after {startup_s:.1f} s", flush=True)
    phases = []
    try:
        for n in replica_counts:
            app.push_catalog(config, CatalogPush(1), replicas=n, gpus=args.gpu)  # scales in place
            load(port, bodies[:50], 2, 3.0)  # warm the new replicas' connections
            records, _ = load(port, bodies, args.clients, args.seconds)
            phases.append(summarise(f"replicas-{n}", records, args.seconds, args.clients, n))
            print(json.dumps(phases[-1]), flush=True)

        rng = np.random.default_rng(0)
        ids = study.catalog.item_ids
        pushes: list = []
        deleted_by: dict = {}

        def push_versions(t0, stop):
            gone: list = []
            for i in range(args.pushes):
                time.sleep(args.seconds / (args.pushes + 1))
                gone = gone + [int(x) for x in rng.choice(ids, size=args.delete, replace=False)]
                version = 2 + i
                deleted_by[version] = set(gone)
                begin = time.perf_counter()
                app.push_catalog(config, CatalogPush(version, deleted=gone), replicas=replica_counts[-1],
                                 gpus=args.gpu)
                pushes.append(dict(version=version, deleted=len(gone), at_s=round(begin - t0, 2),
                                   took_s=round(time.perf_counter() - begin, 2)))

        records, _ = load(port, bodies, args.clients, args.seconds, during=push_versions)
        phase = summarise("push", records, args.seconds, args.clients, replica_counts[-1])
        versions: dict = {}
        stale = 0
        for _, _, status, payload in records:
            if status != 200:
                continue
            answer = json.loads(payload)
            v = answer["catalog_version"]
            versions[str(v)] = versions.get(str(v), 0) + 1
            if set(answer["items"]) & deleted_by.get(v, set()):
                stale += 1
        phase.update(pushes=pushes, answers_per_version=versions, answers_with_deleted_items=stale)
        phases.append(phase)
        print(json.dumps(phase), flush=True)
        # per-replica counters, as GET /metrics reports them (the replica that answers)
        replica_metrics = {}
        for _ in range(20):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/metrics")
            snap = json.loads(conn.getresponse().read())
            conn.close()
            replica_metrics[snap["replica"]] = snap
    finally:
        app.shutdown()

    host = platform.node() or "host"
    out = Path(args.out) if args.out else ROOT / "runs" / "results" / "serve" / f"load-{host}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = environment(torch.device("cuda" if args.gpu else "cpu"))
    machine.update(ray=ray.__version__, cpu_model=_cpu_model(), note="CPU cores shared with the clients, the "
                   "HTTP proxy and other work on the machine" if not args.gpu else "")
    doc = dict(format=FORMAT, kind="serve-load", measured=True, machine=machine, config=config.to_dict(),
               replicas_per="GPU" if args.gpu else "CPU", k=args.k, startup_s=round(startup_s, 1),
               requests_from="bundled MovieLens test users (visible histories), uniformly at random",
               phases=phases, replica_metrics=list(replica_metrics.values()))
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    failed = sum(ph["failed"] for ph in phases)
    return 1 if failed or phases[-1]["answers_with_deleted_items"] else 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "n/a"


if __name__ == "__main__":
    raise SystemExit(main())
