"""The partial last step of the T5 and decoder-only step models: decodes with it equal decodes
without it (filtering first, with and without lists), and the last step leaves the caches as it
found them, so it may run again. The Qwen3 model's: tests/test_partial_last_step.py."""
import numpy as np
import pytest
import torch

from zerogr_core import Catalog, build_index
from zerogr_core.decode import loop as loop_module
from zerogr_core.decode.constraints import build_lists
from zerogr_core.errors import ZeroGRError
from zerogr_core.models.decoder_only import DecoderOnlyConfig, DecoderOnlyRecommender, DecoderOnlyStepModel
from zerogr_core.models.protocol import StepDecoder

DO_SIZES = (6, 7, 5, 4)
T5_SIZES, T5_OFFSETS, T5_VOCAB = (16, 16, 8), (3, 19, 35), 43


def catalog(sizes, n, seed=0):
    rng = np.random.default_rng(seed)
    return Catalog.from_sids(np.unique(np.stack([rng.integers(0, v, n) for v in sizes], axis=1), axis=0), sizes)


def decoder_only():
    torch.manual_seed(0)
    return DecoderOnlyRecommender(DecoderOnlyConfig.preset("tiny", DO_SIZES)).eval()


def t5():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=T5_VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                   num_decoder_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0,
                                   eos_token_id=1, feed_forward_proj="relu", dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(config).eval()


def do_requests(batch=3, t=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    history = torch.stack([torch.randint(0, v, (batch, t), generator=gen) for v in DO_SIZES], dim=2)
    mask = torch.arange(t)[None, :] >= t - torch.tensor([t, 3, 1])[:batch, None]
    return history, mask.long()


def t5_requests(batch=3, t=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, T5_VOCAB, (batch, t), generator=gen)
    mask = (torch.arange(t)[None, :] < torch.tensor([t, 4, 1])[:batch, None]).long()
    return ids * mask, mask


class Asked:
    """Wraps a step model; records the ``rows`` each last step was asked for."""

    def __init__(self, model):
        self.model, self.asked = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def step(self, step, tokens, parents, wanted=None, rows=None):
        if wanted is not None:
            self.asked.append((int(wanted.sum(dim=1).max()), rows, tokens.shape[1]))
        return self.model.step(step, tokens, parents, wanted=wanted, rows=rows)


def servings(kind, partial, beam, device="cpu", spy=True):
    """(step model, wrapped in :class:`Asked` with ``spy``, StepDecoder, catalog, (ids, mask))."""
    wrap = Asked if spy else (lambda sm: sm)
    if kind == "decoder-only":
        m, cat = decoder_only().to(device), catalog(DO_SIZES, 400)
        sm = wrap(DecoderOnlyStepModel(m, partial_last_step=partial))
        run = StepDecoder(sm, build_index(cat, device=device), m.head_weight(), beam_width=beam,
                          band_offsets=m.band_offsets)
        return sm, run, cat, do_requests()
    from zerogr_core.models.t5 import T5StepModel

    m, cat = t5().to(device), catalog(T5_SIZES, 600)
    inner = T5StepModel(m, T5_OFFSETS, partial_last_step=partial)
    inner.kernels = None if device != "cpu" else kind == "t5-kernels"   # the Triton kernels (interpreted on the CPU)
    sm = wrap(inner)
    run = StepDecoder(sm, build_index(cat, device=device), m.lm_head.weight.detach(), beam_width=beam,
                      band_offsets=T5_OFFSETS)
    return sm, run, cat, t5_requests()


@pytest.mark.parametrize("granule", [1, 16])
@pytest.mark.parametrize("lists", [None, "request", "catalog"])
@pytest.mark.parametrize("kind", ["decoder-only", "t5", "t5-kernels"])
def test_partial_last_step_returns_the_full_decode(kind, lists, granule, monkeypatch):
    monkeypatch.setattr(loop_module, "ROW_GRANULE", granule)
    got = {}
    for partial in (True, False):
        sm, run, cat, (ids, mask) = servings(kind, partial, beam=12)
        req = None
        if lists is not None:
            allow = [cat.item_ids[::2], None, None]
            deny = [None, cat.item_ids[::3], cat.item_ids[[0, 5]]]
            req = build_lists(cat, 3, allow, deny, normalise=lists)
        got[partial] = (run.decode(ids, mask, lists=req), sm.asked)
    check_equal_decodes(got, granule)


def check_equal_decodes(got, granule):
    """``got[partial]`` = (result, rows asked) of a decode with and without the partial last step: one
    last step asked for its wanted beams (rounded up to ``granule``), the same beams and scores."""
    (part, asked), (full, none) = got[True], got[False]
    assert none == [] and len(asked) == 1
    most, rows, m = asked[0]
    assert most <= rows == min(m, -(-most // granule) * granule)
    if granule == 1:
        assert rows < m                      # the catalog has single-item prefixes among the beams
    assert (full.item_rows >= 0).any()
    assert torch.equal(part.tokens, full.tokens) and torch.equal(part.item_rows, full.item_rows)
    torch.testing.assert_close(part.scores, full.scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["decoder-only", "t5", "t5-kernels"])
def test_the_last_step_leaves_the_caches_as_it_found_them(kind):
    """Run twice after the same earlier steps, the partial last step returns the same states, those of
    the beams it computes (every wanted one) equal to a full last step's and the others zeros, and changes
    no cache."""
    sm, run, cat, (ids, mask) = servings(kind, True, beam=6)
    model = sm.model
    model.prefill(ids, mask, beam_width=6)
    b, levels = ids.shape[0], model.n_levels
    gen = torch.Generator().manual_seed(1)
    model.step(0, None, None)
    for step in range(1, levels - 1):
        prev = 1 if step == 1 else 6
        parents = torch.arange(b)[:, None] * prev + torch.randint(0, prev, (b, 6), generator=gen)
        model.step(step, torch.randint(0, 4, (b, 6), generator=gen), parents)
    caches = [t.clone() for t in _caches(model)]
    tokens = torch.randint(0, 4, (b, 6), generator=gen)
    parents = torch.arange(b)[:, None] * 6 + torch.randint(0, 6, (b, 6), generator=gen)
    parents[2, 3] = -1                                                       # an unfilled beam
    wanted = torch.rand(b, 6, generator=gen) < 0.5
    rows = int(wanted.sum(dim=1).max())
    first = model.step(levels - 1, tokens, parents, wanted=wanted, rows=rows)
    assert all(torch.equal(a, c) for a, c in zip(_caches(model), caches))
    again = model.step(levels - 1, tokens, parents, wanted=wanted, rows=rows)
    assert torch.equal(first, again)
    full = model.step(levels - 1, tokens, parents)
    # each request computes `rows` beams, its wanted ones first
    order = torch.argsort(wanted.to(torch.int8), dim=1, descending=True, stable=True)[:, :rows]
    computed = torch.zeros_like(wanted).scatter_(1, order, True).reshape(-1)
    assert computed[wanted.reshape(-1)].all() and not computed.all()
    torch.testing.assert_close(first[computed], full[computed], rtol=1e-5, atol=1e-5)
    assert (first[~computed] == 0).all()


def _caches(model):
    """What a later decode step reads: T5's ancestry and the earlier positions' q/k/v (the last
    position's rows are the step's own output), the decoder-only model's key/value caches."""
    if hasattr(model, "ancestors"):
        return [model.ancestors] + [qkv[:model.n_levels - 1] for qkv in model.qkv]
    return [buf for kv in model.cache for buf in kv]


@pytest.mark.parametrize("kind", ["decoder-only", "t5"])
def test_the_option_takes_a_bool_only(kind):
    with pytest.raises(ZeroGRError, match=r"^partial_last_step: expected True or False, got 'no'$"):
        if kind == "decoder-only":
            DecoderOnlyStepModel(decoder_only(), partial_last_step="no")
        else:
            from zerogr_core.models.t5 import T5StepModel

            T5StepModel(t5(), T5_OFFSETS, partial_last_step="no")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("lists", [None, "request"])
@pytest.mark.parametrize("kind", ["decoder-only", "t5"])
def test_cuda_graphs_of_the_last_step_equal_the_reference(kind, lists, monkeypatch):
    """On a GPU the engine captures the steps before the last, then one graph of the last step per
    count of wanted beams: new requests replay them and return the CPU reference's beams (float32)."""
    monkeypatch.setattr(loop_module, "ROW_GRANULE", 2)
    _, ref, cat, _ = servings(kind, False, beam=12)
    _, run, _, _ = servings(kind, True, beam=12, device="cuda", spy=False)
    check_graphs_against_reference(run, ref, cat, do_requests if kind == "decoder-only" else t5_requests, lists, 12)


def check_graphs_against_reference(run, ref, cat, requests, lists, beam):
    """Five batches of new requests (``requests(seed=)``) through ``run``, a GPU StepDecoder with a partial
    last step, return the beams of ``ref``, its CPU reference; the engine captured the two graphs and some
    call ran fewer than ``beam`` rows."""
    for seed in range(5):
        ids, mask = requests(seed=seed)
        req = None
        if lists is not None:
            req = build_lists(cat, 3, None, [cat.item_ids[seed::4], None, cat.item_ids[[0, 5]]], normalise=lists)
        want = ref.decode(ids, mask, lists=req)
        got = run.decode(ids.cuda(), mask.cuda(), lists=req)
        assert torch.equal(got.item_rows.cpu(), want.item_rows), seed
        torch.testing.assert_close(got.scores.cpu(), want.scores, rtol=1e-4, atol=1e-4)
    engine = run.decoder.gpu_engine
    assert engine.graph_error is None and run.prefill_in_graph
    shape = next(iter(engine._shapes.values()))
    assert shape.partial is not None and shape.partial.graphs and not shape.partial.errors
    assert any(rows < beam for rows in shape.partial.graphs)       # some calls ran a partial last step
