"""Online load test of the Qwen3 recommender, in-process, through the serving code.

SID-GR's online setup: context 5,000 tokens, beam 256, 64 requests at concurrency 4
(SID-GR 19.4–20.1 req/s on an H100, SGLang 10.7; the issue's target ≥ 25 req/s). The
GPU image has no Ray, so the clients call the replica's routes in-process:
``concurrency`` asyncio clients each send ``POST /generate`` bodies back to back to one
:class:`~zerogr_core.serve.llm_service.LLMService`, the object the Ray deployment wraps,
so every request is parsed, gathered by the same :class:`~zerogr_core.serve.batching.Batcher`,
padded to a planned batch size and answered as JSON exactly as over HTTP (only the socket
is missing). Every answer is checked: status 200, ``n`` beam results, every item in the
catalog with the SID the catalog gives it.

::

    python -m zerogr_core.serve.llm_load_test --out runs/results/serve-llm            # H200: 1.7B shape, bf16
    python -m zerogr_core.serve.llm_load_test --quick --out /tmp/serve-llm-quick        # CPU: tiny shape, seconds

Writes ``serve_llm.json`` (machine and versions, configs, throughput, latency p50/p90/p99,
failures, invalid items, batch sizes) and ``serve_llm.md`` into ``--out``.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..arg_types import whole
from ..errors import Parser, UsageError, ZeroGRError

FORMAT = "zerogr-serve-llm-load-1"
#: SID-GR's online figures on the same setup (H100, unconstrained), req/s.
SID_GR_RPS = (19.4, 20.1)
SGLANG_RPS = 10.7
TARGET_RPS = 25.0


@dataclass(frozen=True)
class LoadConfig:
    """One load test.

    Attributes
    ----------
    serve : str
        :data:`~zerogr_core.serve.llm.LLM_SERVE_PRESETS` key of the replica.
    context : int
        Tokens per request (random ids of the model's own vocabulary).
    requests : int
    concurrency : int
        Clients, each sending its next request when its last is answered.
    warm_requests : int
        Untimed requests first, at the same concurrency.
    n : int or None
        Beam results per request (None: all M).
    seed : int
    load_timeout_s : float
    """

    serve: str = "qwen3-1.7b"
    context: int = 5000
    requests: int = 64
    concurrency: int = 4
    warm_requests: int = 8
    n: int | None = None
    seed: int = 0
    load_timeout_s: float = 600.0


LOAD_PRESETS = {
    "h200": LoadConfig(),
    "quick": LoadConfig(serve="tiny", context=40, requests=16, concurrency=4, warm_requests=4),
}


def bodies(rec, cfg: LoadConfig) -> list[bytes]:
    """``/generate`` bodies of random contexts over the model's own (non-SID) tokens."""
    rng = np.random.default_rng(cfg.seed)
    params = {"max_new_tokens": rec.levels} if cfg.n is None else {"max_new_tokens": rec.levels, "n": cfg.n}
    return [json.dumps({"input_ids": rng.integers(0, rec.offsets[0], cfg.context).tolist(),
                        "sampling_params": params, "rid": f"load-{i}"}).encode() for i in range(cfg.requests)]


async def drive(service, payloads: list[bytes], concurrency: int) -> tuple[list, float]:
    """Send ``payloads`` from ``concurrency`` clients; ``(records, wall seconds)``, a record
    being ``(latency ms, status, reply)``."""
    queue = list(reversed(payloads))
    records: list = []

    async def client():
        while queue:
            body = queue.pop()
            start = time.perf_counter()
            reply = await service.handle("POST", "/generate", "", body)
            records.append(((time.perf_counter() - start) * 1e3, reply.status, reply))

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return records, time.perf_counter() - t0


def invalid_items(rec, reply, n: int) -> int:
    """Beam results of a 200 reply that are not catalog items with their catalog SIDs (or missing)."""
    results = reply.json()["beam_results"]
    bad = max(0, n - len(results))
    if not results:
        return bad
    items = [r["item"] for r in results]
    try:
        rows = rec.catalog.rows_of(items, what="item")
    except ZeroGRError:  # some item is not in the catalog: find which, one by one
        rows = []
        for item in items:
            try:
                rows.append(int(rec.catalog.rows_of([item], what="item")[0]))
            except ZeroGRError:
                rows.append(-1)
        rows = np.asarray(rows)
    sids = rec.catalog.sids[np.maximum(rows, 0)].astype(np.int64)
    codes = np.asarray([r["sid"] for r in results], dtype=np.int64)
    ids = np.asarray([r["output_ids"] for r in results], dtype=np.int64)
    ok = (rows >= 0) & (codes == sids).all(1) & (ids == sids + np.asarray(rec.offsets)).all(1)
    return bad + int((~ok).sum())


def summarise(records: list, wall_s: float, rec, n: int) -> dict:
    """The load test's counts and latencies (:func:`~zerogr_core.serve.load_test.request_summary`),
    items outside the catalog, and throughput."""
    from .load_test import request_summary

    summary = request_summary([r[0] for r in records], [r[1] for r in records])
    invalid = sum(invalid_items(rec, reply, n) for _, status, reply in records if status == 200)
    return dict(summary, invalid_items=invalid, wall_s=round(wall_s, 3),
                throughput_rps=round(len(records) / wall_s, 2))


def run(cfg: LoadConfig, out: Path, command: str, log=print) -> dict:
    """Run the load test and write ``serve_llm.json`` and ``serve_llm.md`` into ``out``."""
    import torch

    from .llm import LLMServeConfig
    from .llm_service import LLMService
    from ..environment import environment

    serve_cfg = LLMServeConfig.preset(cfg.serve, warmup_context=cfg.context,
                                      max_context=max(cfg.context, LLMServeConfig.preset(cfg.serve).max_context))
    service = LLMService(serve_cfg)
    rec = service.wait_ready(cfg.load_timeout_s)
    log(f"loaded and warmed in {service.load_s:.1f} s: {rec.describe()}")
    n = cfg.n or serve_cfg.beam
    payloads = bodies(rec, cfg)
    if cfg.warm_requests:
        asyncio.run(drive(service, payloads[:cfg.warm_requests], cfg.concurrency))
    before = service.metrics.snapshot()
    rec.decode_ms.clear()
    records, wall = asyncio.run(drive(service, payloads, cfg.concurrency))
    decodes = list(rec.decode_ms)
    after = service.metrics.snapshot()
    batches = {k: v - before["batch_sizes"].get(k, 0) for k, v in after["batch_sizes"].items()}
    result = summarise(records, wall, rec, n)
    per_size = {}
    for size, ms in decodes:
        per_size.setdefault(str(size), []).append(ms)
    result.update(decode_ms_median={k: round(float(np.median(v)), 2) for k, v in sorted(per_size.items())},
                  decode_busy_fraction=round(sum(ms for _, ms in decodes) / 1e3 / wall, 3),
                  batch_sizes={k: v for k, v in batches.items() if v}, n=n, context=cfg.context,
                  concurrency=cfg.concurrency, beam=serve_cfg.beam,
                  target_rps=TARGET_RPS if cfg.serve == "qwen3-1.7b" else None)
    if result["target_rps"] is not None:
        result["met"] = result["throughput_rps"] >= TARGET_RPS
    log(json.dumps(result))
    doc = dict(format=FORMAT, kind="serve-llm-load", measured=True, command=command,
               machine=environment(rec.device), load=asdict(cfg), serve=serve_cfg.to_dict(), model=rec.describe(),
               load_s=round(service.load_s, 1), path="in-process: LLMService.handle (JSON parse, Batcher, padded "
               "planned batch, LLMRecommender, JSON answer), no socket", result=result,
               peers=dict(sid_gr_rps=list(SID_GR_RPS), sglang_rps=SGLANG_RPS, setup="H100, Qwen3-1.7B, context "
                          "5,000, beam 256, 64 requests, concurrency 4, unconstrained"),
               peak_gb=round(torch.cuda.max_memory_allocated(rec.device) / 1e9, 2) if rec.device.type == "cuda"
               else None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_llm.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "serve_llm.md").write_text(markdown(doc))
    return doc


def markdown(doc: dict) -> str:
    r, m = doc["result"], doc["machine"]
    return "\n".join([
        f"# Online load test: Qwen3 {doc['model']['model']} ({doc['model']['weights']} weights, "
        f"{doc['model']['dtype']}), {doc['model']['items']:,} items",
        "", f"{m.get('gpu')}, torch {m.get('torch')}, triton {m.get('triton')}, commit {m.get('git_commit')}; "
        f"{doc['path']}.", "",
        "| context | beam | requests | concurrency | req/s | p50 ms | p99 ms | failed | invalid items | batch sizes "
        "| decode ms per batch (median) | target | SID-GR (H100) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {r['context']:,} | {r['beam']} | {r['requests']} | {r['concurrency']} | {r['throughput_rps']} | "
        f"{r['p50_ms']} | {r['p99_ms']} | {r['failed']} | {r['invalid_items']} | "
        f"{', '.join(f'{k}×{v}' for k, v in sorted(r['batch_sizes'].items(), key=lambda kv: int(kv[0])))} | "
        f"{', '.join(f'{k}: {v}' for k, v in r['decode_ms_median'].items())} | "
        f"{'≥ %g' % r['target_rps'] if r.get('target_rps') else ''} | "
        f"{doc['peers']['sid_gr_rps'][0]}–{doc['peers']['sid_gr_rps'][1]} |", ""])


def main(argv=None) -> int:
    p = Parser(prog="python -m zerogr_core.serve.llm_load_test",
               description="Online load test of the Qwen3 recommender, in-process")
    p.add_argument("--out", required=True, help="folder for serve_llm.json and serve_llm.md")
    p.add_argument("--quick", action="store_true", help="the tiny shape on the CPU (seconds)")
    p.add_argument("--requests", type=whole(1), default=None)
    p.add_argument("--concurrency", type=whole(1), default=None)
    p.add_argument("--context", type=whole(1), default=None)
    try:
        a = p.parse_args(argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    cfg = LOAD_PRESETS["quick" if a.quick else "h200"]
    for name in ("requests", "concurrency", "context"):
        if getattr(a, name) is not None:
            cfg = replace(cfg, **{name: getattr(a, name)})
    command = "python -m zerogr_core.serve.llm_load_test " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        doc = run(cfg, Path(a.out), command)
    except ZeroGRError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    r = doc["result"]
    return 1 if r["failed"] or r["invalid_items"] else 0


if __name__ == "__main__":
    sys.exit(main())
