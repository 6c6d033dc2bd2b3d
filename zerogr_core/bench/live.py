"""Load test of a live catalog: threads decode while the catalog changes.

:func:`run_load_test` runs ``threads`` decoding loops on a
:class:`~zerogr_core.decode.store.CatalogStore`, first with no changes (idle), then while
a writer changes the catalog every ``change_every_s`` seconds, cycling through deletes,
adds and full replaces. Every result is checked against the version it ran on:

- *failed*: the decode raised;
- *invalid*: a beam whose row is not an item of its version or whose tokens are not that
  row's SID;
- *deleted*: a beam whose item was deleted in its version, or a decode that started after
  a change was published but ran on an older version (a deletion not yet in effect).

Both counts must be 0. Latency percentiles of the two phases come back side by side.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..catalog.catalog import Catalog
from ..timing import summarize
from ..decode.store import DEFAULT_COMPACT_FRACTION, CatalogStore, StoreResult


def _packed(sids: np.ndarray, bits: list[int]) -> np.ndarray:
    key = np.zeros(sids.shape[0], dtype=np.int64)
    for level, b in enumerate(bits):
        key = (key << b) | sids[:, level].astype(np.int64)
    return key


def new_items(catalog: Catalog, count: int, rng: np.random.Generator) -> Catalog:
    """``count`` items with SIDs not in ``catalog`` (within its codebooks) and ids it does not hold."""
    sizes = np.asarray(catalog.codebook_sizes, dtype=np.int64)
    bits = [int(v - 1).bit_length() or 1 for v in sizes]
    if sum(bits) > 63:
        raise ValueError("new_items needs SIDs that pack into 63 bits")
    taken = _packed(catalog.sids, bits)  # sorted: the catalog's rows are in SID order
    fresh = np.zeros(0, dtype=np.int64)
    rows = np.zeros((0, sizes.size), dtype=np.int64)
    for _ in range(100):
        cand = rng.integers(0, sizes[None, :], size=(max(16, 2 * count), sizes.size))
        keys = _packed(cand, bits)
        pos = np.minimum(np.searchsorted(taken, keys), taken.size - 1)
        new = (taken[pos] != keys) & ~np.isin(keys, fresh)
        keys, first = np.unique(keys[new], return_index=True)
        fresh = np.concatenate([fresh, keys])
        rows = np.concatenate([rows, cand[new][first]])
        if fresh.size >= count:
            break
    rows = rows[:count]
    return Catalog.from_sids(rows, catalog.codebook_sizes, item_ids=catalog.fresh_ids(rows.shape[0]),
                             band_offsets=catalog.band_offsets)


def check_result(out: StoreResult, started_after_version: int) -> tuple[int, int]:
    """(invalid beams, deleted beams) of one store result."""
    v = out.snapshot
    rows = out.result.item_rows.cpu().numpy()
    tokens = out.result.tokens.cpu().numpy()
    real = rows >= 0
    invalid = int((rows[real] >= v.catalog.n_items).sum())
    ok = real & (rows < v.catalog.n_items)
    sids = v.catalog.sids[rows[ok]].astype(np.int64)
    invalid += int((sids != tokens[ok]).any(axis=1).sum())
    deleted = int(np.isin(rows[ok], v.deleted_rows).sum())
    if out.version < started_after_version:
        deleted += 1
    return invalid, deleted


def run_load_test(store: CatalogStore, hidden_fn, batch: int, *, threads: int = 4, seconds: float = 2.0,
                  change_every_s: float = 1.0, deletes_per_change: int = 50, adds_per_change: int = 50,
                  replace_every: int = 3, seed: int = 0) -> dict:
    """Decode from ``threads`` threads, idle then while the catalog changes; count failures.

    Parameters
    ----------
    store : CatalogStore
    hidden_fn : callable(step, prefixes) -> (batch, beams, H)
        Shared by every thread (a GPU engine captures one graph per hidden_fn).
    batch : int
        Requests per decode.
    threads : int
    seconds : float
        Length of each phase.
    change_every_s : float
        Interval between catalog changes in the second phase.
    deletes_per_change, adds_per_change : int
    replace_every : int
        Every ``replace_every``-th change is a full replace (a new catalog: 90 % of the live
        items and new ones); the others alternate deletes and adds.
    seed : int

    Returns
    -------
    dict
        ``requests``, ``failed``, ``invalid``, ``deleted`` (both phases), ``changes``,
        ``versions``, ``idle`` and ``churn`` latency stats (:func:`zerogr_core.timing.summarize`:
        ``median_ms``, ``p99_ms``, ``n``, …), ``errors`` (first messages), ``change_log``.
    """
    rng = np.random.default_rng(seed)
    lock = threading.Lock()
    totals = dict(requests=0, failed=0, invalid=0, deleted=0)
    errors: list[str] = []
    published = [store.version]  # versions in publish order (last = newest)

    def worker(stop: threading.Event, samples: list) -> None:
        while not stop.is_set():
            floor = published[-1]
            t0 = time.perf_counter()
            try:
                out = store.decode(hidden_fn, batch)  # returns after the host copy of the beams
                dt = time.perf_counter() - t0
                bad, gone = check_result(out, floor)
                with lock:
                    totals["requests"] += 1
                    totals["invalid"] += bad
                    totals["deleted"] += gone
                    samples.append(dt)
            except Exception as exc:  # noqa: BLE001 - counted, the test reports them
                with lock:
                    totals["requests"] += 1
                    totals["failed"] += 1
                    if len(errors) < 5:
                        errors.append(f"{type(exc).__name__}: {exc}")

    def phase(changes: bool) -> list[float]:
        stop = threading.Event()
        samples: list[float] = []
        pool = [threading.Thread(target=worker, args=(stop, samples), daemon=True) for _ in range(threads)]
        for t in pool:
            t.start()
        t_end = time.perf_counter() + seconds
        k = 0
        while time.perf_counter() < t_end:
            if changes:
                time.sleep(min(change_every_s, max(t_end - time.perf_counter(), 0)))
                if time.perf_counter() >= t_end:
                    break
                k += 1
                try:
                    published.append(change(k))
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"change {k}: {type(exc).__name__}: {exc}")
            else:
                time.sleep(0.02)
        stop.set()
        for t in pool:
            t.join()
        return samples

    def change(k: int) -> int:
        v = store.current
        live = v.live_ids()
        if k % replace_every == 0:
            base = v.catalog
            live_rows = np.setdiff1d(np.arange(base.n_items), v.deleted_rows)
            rows = np.sort(rng.choice(live_rows, int(0.9 * live_rows.size), replace=False))
            kept = Catalog.from_sids(base.sids[rows], base.codebook_sizes, item_ids=base.item_ids[rows],
                                     band_offsets=base.band_offsets, name=base.name)
            extra = new_items(base, adds_per_change, rng)  # new w.r.t. every id and SID of the version
            fresh = Catalog.from_sids(np.concatenate([kept.sids.astype(np.int64), extra.sids.astype(np.int64)]),
                                      base.codebook_sizes, item_ids=np.concatenate([kept.item_ids, extra.item_ids]),
                                      band_offsets=base.band_offsets, name=base.name)
            return store.replace(fresh)
        if k % 2:
            return store.apply(deletes=live[rng.choice(live.size, min(deletes_per_change, live.size - 1),
                                                       replace=False)])
        return store.apply(adds=new_items(v.catalog, adds_per_change, rng))

    def stats(samples: list[float]) -> dict:
        out = summarize([1e3 * t for t in samples])
        return out if out["n"] else dict(n=0, median_ms=float("nan"), p99_ms=float("nan"))

    store.decode(hidden_fn, batch)  # warm-up (plan, capture) outside the timed phases
    v0 = store.version
    idle = stats(phase(False))
    churn = stats(phase(True))
    return dict(totals, changes=store.version - v0, versions=[v0, store.version], idle=idle, churn=churn,
                p50_ratio=churn["median_ms"] / idle["median_ms"] if idle["n"] else float("nan"),
                p99_ratio=churn["p99_ms"] / idle["p99_ms"] if idle["n"] else float("nan"),
                errors=errors, change_log=list(store.history))


# ---------------------------------------------------------------------------- bench suites
def _random_lists(n_items: int, batch: int, kind: str, count: int, rng: np.random.Generator):
    """Per-request row lists for the constraint suite: ``count`` random rows each (``kind``
    "allow", "deny", or "deny-catalog": a deny list under the catalog's normalisation)."""
    from ..decode.constraints import RequestLists

    lists = [np.unique(rng.choice(n_items, size=min(count, n_items), replace=False)) for _ in range(batch)]
    offsets = np.zeros(batch + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([x.size for x in lists])
    rows = np.concatenate(lists).astype(np.int64) if batch else np.zeros(0, dtype=np.int64)
    return RequestLists(offsets, rows, np.full(batch, 1 if kind == "allow" else 0, dtype=np.int32),
                        normalise="catalog" if kind == "deny-catalog" else "request")


def constraint_conditions(n_items: int, quick: bool) -> list[tuple[str, str, int]]:
    """(label, kind, listed rows per request): 0, 100, 10,000 denied (the last also under the
    catalog's normalisation); an allow list of 1 %."""
    deny = [0, 100, 10_000] if not quick else [0, 10, 100]
    out = [(f"deny {d:,}", "deny", min(d, n_items - 1)) for d in deny]
    out.append((f"deny {deny[-1]:,}, catalog-normalised", "deny-catalog", min(deny[-1], n_items - 1)))
    return out + [("allow 1%", "allow", max(1, n_items // 100))]


def suite_constraints(s, suite: str) -> None:
    """Whole-decode latency with per-request lists (graph replay on CUDA) against none."""
    from .checks import check_valid
    from .methods import ReplayModel
    from ..timing import time_runs

    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dtype, hidden = st["configs"][0]
    beam = st["beams"][0]
    rng = np.random.default_rng(s.o.seed)
    for batch in st["batches"]:
        if s.expired():
            s.skipped(suite, wl, f"batch {batch}")
            continue
        ctx = wl.context(dtype, hidden, beam, batch, s.o.n_sets)
        model = ReplayModel(ctx.sets, batch)
        shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
        engine = ctx.engine
        base = None
        line = []
        for label, kind, count in [("none", "none", 0)] + constraint_conditions(wl.catalog.n_items, s.o.quick):
            if s.expired():
                s.skipped(suite, wl, f"{label} batch {batch}")
                break
            lists = None if kind == "none" else _random_lists(wl.catalog.n_items, batch, kind, count, rng)
            try:
                out = engine.decode(model, batch, lists=lists)
                v = check_valid(wl.index, out.tokens, out.scores, out.item_rows, constrained=True)
                rows = out.item_rows.cpu().numpy()
                violations = 0 if lists is None else int(sum(
                    (~lists.allows(r, rows[r][rows[r] >= 0])).sum() for r in range(batch)))
                samples = time_runs(lambda: engine.decode(model, batch, lists=lists), s.dev,
                                    repeats=5 if s.o.quick else 50, warmup=2, before=model.load)
            except Exception as exc:  # noqa: BLE001 - one condition's failure must not lose the others
                s.error(suite, wl, f"{label} batch {batch}", exc)
                continue
            s.emit(suite, "check", wl, dict(methods=["zerogr"], **shape), method="zerogr", **shape,
                   check=f"valid items within the lists ({label})", passed=bool(v["passed"] and violations == 0),
                   list_violations=violations)
            stats = summarize(samples)
            if kind == "none":
                base = stats
            rec = dict(method="zerogr", condition=label, list_kind=kind, listed_per_request=count,
                       list_bytes_per_decode=0 if lists is None else 8 * lists.total_rows,
                       graph=engine.use_graph, valid=v["passed"], list_violations=violations, **shape, **stats)
            if base is not None and kind != "none":
                rec.update(p50_ratio=stats["median_ms"] / base["median_ms"], p99_ratio=stats["p99_ms"] / base["p99_ms"])
            s.emit(suite, "constraints", wl, dict(methods=["zerogr"], **shape), **rec)
            line.append(f"{label}: p50={stats['median_ms']:.3f} ms")
        s.log(f"[{suite}] {wl.spec.label} {ctx.label} beam {beam} batch {batch}: " + "; ".join(line))
        _public_api(s, suite, wl, ctx, model, shape, rng)
        ctx.release()


def api_conditions(n_items: int, quick: bool, cuda: bool = False) -> list[tuple[str, str, int, str]]:
    """(label, kind, listed ids per request, normalise) of the public-API part: no lists,
    deny 0 / 100 / 10,000 ids (the last also catalog-normalised), an allow list of 1 % of
    the catalog passed per call (on CUDA also as pinned host tensors, which cross without
    being gathered into the decoder's own pinned block first), the same set registered once
    and named per request, and a registered deny set named by every request."""
    deny = [0, 10, 100] if quick else [0, 100, 10_000]
    one = max(1, n_items // 100)
    out = [("none", "none", 0, "request")]
    out += [(f"deny {d:,}", "deny", min(d, n_items - 1), "request") for d in deny]
    out.append((f"deny {deny[-1]:,}, catalog-normalised", "deny", min(deny[-1], n_items - 1), "catalog"))
    out.append(("allow 1%", "allow", one, "request"))
    if cuda:
        out.append(("allow 1%, pinned ids", "allow-pinned", one, "request"))
    out.append(("allow 1%, registered", "allow-registered", one, "request"))
    out.append((f"deny {deny[-1]:,}, registered", "deny-registered", min(deny[-1], n_items - 1), "request"))
    return out


def _public_api(s, suite: str, wl, ctx, model, shape: dict, rng: np.random.Generator) -> None:
    """Whole-call latency of ``Decoder.decode(..., deny_items=/allow_items=)`` with item ids,
    as a user calls it (list building and copies included), against the same decoder
    without lists. The decoder decodes through the suite's engine (its plan and graphs);
    a registered allow set builds its sub-catalog index and plans once, before timing."""
    import torch

    from ..decode.decoder import Decoder
    from .checks import check_valid
    from ..timing import paired_runs, time_runs

    batch = shape["batch"]
    cat = wl.catalog
    dec = Decoder(wl.index, beam_width=ctx.beam, catalog=cat, **wl.decoder_heads(ctx.heads))
    if dec.gpu_engine is not None:
        dec.gpu_engine = ctx.engine
    base, line = None, []
    for label, kind, count, normalise in api_conditions(cat.n_items, s.o.quick, s.dev.type == "cuda"):
        if s.expired():
            s.skipped(suite, wl, f"public API {label} batch {batch}")
            break
        # ids drawn with repetition (a user's list may repeat ids): a draw without it
        # would permute the whole catalog
        ids = [cat.item_ids[rng.integers(0, cat.n_items, count)] for _ in range(batch)]
        kwargs = dict(normalise=normalise)
        if kind in ("deny", "allow"):
            kwargs[f"{kind}_items"] = ids
        elif kind == "allow-pinned":
            kwargs["allow_items"] = [torch.from_numpy(a).pin_memory() for a in ids]
        elif kind.endswith("registered"):
            what = kind.split("-")[0]
            dec.register_items(label, ids[0], kind=what, index=True if what == "allow" else None)
            ids = [ids[0]] * batch
            kwargs[f"{what}_items"] = label
        try:
            out = dec.decode(model, batch, **kwargs)
            v = check_valid(wl.index, out.tokens, out.scores, out.item_rows, constrained=True)
            lists = None if kind == "none" else dec.request_lists(
                batch, ids if kind.startswith("allow") else None, ids if kind.startswith("deny") else None)
            rows = out.item_rows.cpu().numpy()
            violations = 0 if lists is None else int(sum(
                (~lists.allows(r, rows[r][rows[r] >= 0])).sum() for r in range(batch)))
            heavy = count * batch > 1_000_000
            built = {}
            if kind in ("deny", "allow", "allow-pinned"):
                # the list building alone, on each path (the call above took the default one)
                for path in ("host", "device"):
                    built[f"build_{path}_ms"] = summarize(time_runs(
                        lambda: dec.request_lists(batch, kwargs.get("allow_items"), kwargs.get("deny_items"),
                                                  normalise=normalise, path=path),
                        s.dev, repeats=3 if heavy or s.o.quick else 10, warmup=1))["median_ms"]
            repeats, warmup = (3 if s.o.quick else (10 if heavy else 30)), (1 if heavy else 3)
            if kind == "none":
                samples, paired = time_runs(lambda: dec.decode(model, batch), s.dev, repeats=repeats,
                                            warmup=warmup, before=model.load), None
            else:  # taking turns with the list-free call: its ratio sees the host's drift on both sides
                both = paired_runs({"lists": lambda: dec.decode(model, batch, **kwargs),
                                    "none": lambda: dec.decode(model, batch)},
                                   s.dev, repeats=repeats, warmup=warmup, before=model.load)
                samples, paired = both["lists"], summarize(both["none"])
        except Exception as exc:  # noqa: BLE001 - one condition's failure must not lose the others
            s.error(suite, wl, f"public API {label} batch {batch}", exc)
            continue
        finally:
            if kind.endswith("registered") and label in dec.registry:
                dec.unregister_items(label)
        s.emit(suite, "check", wl, dict(methods=["zerogr"], **shape), method="zerogr", **shape,
               check=f"valid items within the lists, public API ({label})",
               passed=bool(v["passed"] and violations == 0), list_violations=violations)
        stats = summarize(samples)
        if kind == "none":
            base = stats
        rec = dict(method="zerogr", path="public API", condition=label, list_kind=kind, normalise=normalise,
                   listed_per_request=count, valid=v["passed"], list_violations=violations,
                   list_path=_list_path(dec, batch, kind, kwargs, lists),
                   **built, **shape, **stats)
        if paired is not None:
            rec.update(none_paired_median_ms=paired["median_ms"], none_paired_p99_ms=paired["p99_ms"],
                       p50_ratio=stats["median_ms"] / paired["median_ms"], p99_ratio=stats["p99_ms"] / paired["p99_ms"])
            if base is not None:  # against the list-free call timed alone before the conditions
                rec.update(p50_ratio_unpaired=stats["median_ms"] / base["median_ms"])
        s.emit(suite, "constraints-api", wl, dict(methods=["zerogr"], **shape), **rec)
        line.append(f"{label}: p50={stats['median_ms']:.3f} ms" +
                    (f" ({rec['p50_ratio']:.2f}x)" if "p50_ratio" in rec else ""))
    s.log(f"[{suite}] public API {wl.spec.label} {ctx.label} beam {ctx.beam} batch {batch}: " + "; ".join(line))


def _list_path(dec, batch: int, kind: str, kwargs: dict, lists) -> str | None:
    """Where the timed call built its lists: "ids" (deny ids resolved in the decode's graph),
    "bitmaps" (allow ids turned into bitmaps there), "sub-catalog" (a registered allow set's own
    index), "registered" (a registered deny set as the global segment), "host" or "device"
    (:meth:`Decoder.request_lists`), ``None`` without lists."""
    if lists is None or lists.empty:  # nothing listed: the list-free path
        return None
    if kind == "allow-registered":  # registered with its own index: the decode runs over the sub-catalog
        return "sub-catalog"
    if kind == "deny-registered":  # the set's rows as the batch's global segment
        return "registered"
    if kind == "deny" and dec._deny_ids(batch, None, kwargs["deny_items"], kwargs["normalise"], None, None):
        return "ids"
    if kind.startswith("allow") and dec._allow_ids(batch, kwargs.get("allow_items"), None, kwargs["normalise"],
                                                   None, None):
        return "bitmaps"
    return "host" if isinstance(lists.rows, np.ndarray) else "device"


def suite_live(s, suite: str) -> None:
    """The live-catalog load test at the workload's scale (GPU engine per version)."""
    from ..decode.decoder import Decoder
    from .methods import ReplayModel

    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dtype, hidden = st["configs"][0]
    beam, batch = st["beams"][0], st["batches"][0]
    ctx = wl.context(dtype, hidden, beam, batch, 1)
    model = ReplayModel(ctx.sets, batch)
    heads = wl.decoder_heads(ctx.heads)

    def make_decoder(catalog, index):
        return Decoder(index, beam_width=beam, catalog=catalog, **heads)

    seconds = s.o.interference_s if s.o.interference_s is not None else (0.6 if s.o.quick else 10.0)
    t0 = time.perf_counter()
    def warmup(decoder) -> None:
        # Plan and capture before the version goes live, with list buffers already sized for
        # the most deletions the version can carry (no re-capture while serving).
        reserve = np.arange(int(DEFAULT_COMPACT_FRACTION * decoder.catalog.n_items) + 1, dtype=np.int64)
        decoder.decode(model, batch, lists=decoder.request_lists(batch, global_deny_rows=reserve))

    store = CatalogStore(wl.catalog, make_decoder, device=s.dev, warmup=warmup)
    setup_s = time.perf_counter() - t0
    shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
    report = run_load_test(store, model, batch, threads=2 if s.o.quick else 4, seconds=seconds,
                           change_every_s=0.2 if s.o.quick else 1.0,
                           deletes_per_change=100 if s.o.quick else 1000,
                           adds_per_change=100 if s.o.quick else 1000, seed=s.o.seed)
    s.emit(suite, "live", wl, dict(methods=["zerogr"], **shape), method="zerogr", **shape, setup_s=setup_s,
           passed=report["failed"] == 0 and report["invalid"] == 0 and report["deleted"] == 0,
           **{k: v for k, v in report.items() if k != "change_log"}, change_log=report["change_log"][-20:])
    s.emit(suite, "check", wl, dict(methods=["zerogr"], **shape), method="zerogr", **shape,
           check="live catalog: no failed request, no invalid or deleted item",
           passed=report["failed"] == 0 and report["invalid"] == 0 and report["deleted"] == 0)
    s.log(f"[{suite}] {wl.spec.label}: {report['requests']} requests, failed {report['failed']}, invalid "
          f"{report['invalid']}, deleted {report['deleted']}, {report['changes']} versions; idle p50/p99 "
          f"{report['idle']['median_ms']:.2f}/{report['idle']['p99_ms']:.2f} ms, churn "
          f"{report['churn']['median_ms']:.2f}/{report['churn']['p99_ms']:.2f} ms")
    ctx.release()
