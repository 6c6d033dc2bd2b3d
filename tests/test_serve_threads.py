"""One engine, many callers: 8 threads decode through one GPU engine (on the CPU, reference
ops) and through one reference-path Decoder, and every result equals a single-threaded run."""
import threading

import numpy as np
import pytest
import torch

from zerogr_core import Catalog, Decoder, build_index
from zerogr_core.decode.constraints import RequestLists
from zerogr_core.decode.engine import GpuEngine
from zerogr_core.decode.heads import Heads

SIZES = (16, 8, 6)
HIDDEN = 32
BEAM = 8
THREADS = 8
CALLS = 3  # per thread


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    # The PyTorch reference ops on CPU tensors (the Triton interpreter would take minutes).
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def setup():
    rng = np.random.default_rng(3)
    sids = np.unique(np.stack([rng.integers(0, s, 400) for s in SIZES], 1), axis=0)
    catalog = Catalog.from_sids(sids, SIZES)
    g = torch.Generator().manual_seed(0)
    heads = [torch.randn(s, HIDDEN, generator=g) for s in SIZES]
    return catalog, build_index(catalog), heads


def request(seed: int):
    """A request batch of its own: batch size, prefix-dependent hidden states and deny lists."""
    batch = 1 + seed % 4
    table = torch.randn(97, HIDDEN, generator=torch.Generator().manual_seed(1000 + seed))

    def hidden_fn(step, prefixes):
        key = (prefixes.clamp(min=0) * 11 + 5).sum(-1) + step * 17
        return table[key % 97]

    rng = np.random.default_rng(seed)
    deny = [rng.choice(50, size=int(rng.integers(0, 6)), replace=False) for _ in range(batch)]
    return hidden_fn, batch, (RequestLists.from_rows(deny=deny) if seed % 2 else None)


def hammer(decode, seeds):
    """Results of ``decode(seed)`` for every seed, from THREADS threads started together."""
    results, errors = {}, []
    start = threading.Barrier(THREADS)

    def worker(mine):
        start.wait()
        try:
            for s in mine:
                results[s] = decode(s)
        except Exception as exc:  # reported below with its seed
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seeds[t::THREADS],)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def check(decode):
    seeds = list(range(THREADS * CALLS))
    alone = {s: decode(s) for s in seeds}
    together = hammer(decode, seeds)
    for s in seeds:
        a, b = alone[s], together[s]
        assert torch.equal(a.item_rows, b.item_rows), f"request {s}: beams differ under concurrency"
        assert torch.equal(a.tokens, b.tokens), f"request {s}"
        assert torch.equal(a.scores, b.scores), f"request {s}"


def test_one_engine_serves_eight_threads():
    catalog, index, heads = setup()
    plan = ["dense+full/small", "sparse+selective/small", "sparse+full/prune"]
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), BEAM, plan_override=plan, use_graph=False,
                       plan_store=False)

    def decode(seed):
        fn, batch, lists = request(seed)
        return engine.decode(fn, batch, lists=lists)

    check(decode)


def test_one_reference_decoder_serves_eight_threads():
    catalog, index, heads = setup()
    decoder = Decoder(index, heads, BEAM, engine="reference", catalog=catalog)

    def decode(seed):
        fn, batch, lists = request(seed)
        return decoder.decode(fn, batch, lists=lists)

    check(decode)
