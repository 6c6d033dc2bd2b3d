"""The one beam loop with a KV-cache model inside: the engine's code path equals the reference.

The engine runs the model's ``step(l, tokens, parents)`` inside the loop it captures in a
CUDA graph; on a CPU the same loop runs eagerly with the same static buffers. Here every
KV-cache model (the bundled TIGER-style recommender, the decoder-only recommender and the
Hugging Face T5 step model) decodes through that path and must give the reference's beams
(recomputing every position from the prefixes), compute each position once, and read the
tokens and parents from the previous step's static output buffers.
"""
import functools

import numpy as np
import pytest
import torch

from zerogr_core import Catalog, Decoder, build_index
from zerogr_core.decode.engine import GpuEngine
from zerogr_core.decode.heads import Heads
from zerogr_core.decode.loop import BeamLoop, is_step_model
from zerogr_core.errors import ZeroGRError

BATCH, BEAM = 2, 6


def tiger_case(device="cpu"):
    from zerogr_core.models.tiger import TigerStepModel
    from zerogr_core.recsys.train import load_checkpoint

    pytest.importorskip("polars", reason="the bundled MovieLens catalog is a CSV read through Polars")
    study = load_checkpoint(device=device)
    model, sids = study.model, study.sids.to(device)
    histories = [np.arange(3, 30), np.array([11, 12])]
    step_model = TigerStepModel(model)
    return dict(index=build_index(study.catalog, device=device), heads=model.head_weights(), band_offsets=None,
                step_model=step_model, prefill=lambda: step_model.prefill_rows(histories, sids, beam_width=BEAM),
                reference=model.hidden_fn_for(histories, sids), counted=model.decoder[0].ff, first_positions=BATCH)


def small_catalog(sizes, n, seed):
    rng = np.random.default_rng(seed)
    sids = np.unique(np.stack([rng.integers(0, v, n) for v in sizes], axis=1), axis=0)
    return Catalog.from_sids(sids, sizes)


def decoder_only_case(device="cpu", staged=False):
    """``staged``: the requests are staged, so the history pass runs at step 0 (in the loop)."""
    from zerogr_core.models.decoder_only import DecoderOnlyConfig, DecoderOnlyRecommender

    sizes = (6, 7, 5, 4)
    torch.manual_seed(0)
    model = DecoderOnlyRecommender(DecoderOnlyConfig.preset("tiny", sizes)).to(device).eval()
    gen = torch.Generator().manual_seed(3)
    lengths, t = [4, 2], 4
    history = torch.stack([torch.randint(0, v, (BATCH, t), generator=gen) for v in sizes], dim=2)
    mask = torch.arange(t)[None, :] >= t - torch.tensor(lengths)[:, None]
    history, mask = torch.where(mask[..., None], history, 0).to(device), mask.to(device)
    step_model = model.step_model()

    def reference(step, prefixes):
        return model.recompute_hidden(history, mask, prefixes)

    return dict(index=build_index(small_catalog(sizes, 300, 0), device=device), heads=model.head_weight(),
                band_offsets=model.band_offsets, step_model=step_model,
                prefill=lambda: (step_model.stage if staged else step_model.prefill)(history, mask, beam_width=BEAM),
                reference=reference, counted=model.blocks[0].ff,
                first_positions=BATCH * (step_model.bucket(t) if staged else t))


def t5_case(device="cpu"):
    transformers = pytest.importorskip("transformers")
    from zerogr_core.models.hf import hidden_outputs
    from zerogr_core.models.t5 import T5StepModel

    sizes, offsets = (4, 5, 6), (3, 7, 12)
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=20, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                                   dropout_rate=0.0)
    model = transformers.T5ForConditionalGeneration(config).to(device).eval()
    ids = torch.tensor([[0, 0, 5, 9, 13, 4], [8, 15, 6, 10, 3, 17]], device=device)
    mask = (torch.arange(6)[None, :] >= torch.tensor([[2], [0]])).long().to(device)
    step_model = T5StepModel(model, offsets)

    @torch.no_grad()
    def reference(step, prefixes):
        """Hugging Face's own forward over the whole decoder input, no cache."""
        b, beams = prefixes.shape[:2]
        dec = prefixes.clamp(min=0) + torch.tensor(offsets[:step], dtype=torch.int64, device=device)
        start = torch.zeros(b, beams, 1, dtype=torch.int64, device=device)
        dec = torch.cat([start, dec], dim=2).reshape(b * beams, step + 1)
        with hidden_outputs(model):
            out = model(input_ids=ids.repeat_interleave(beams, 0), attention_mask=mask.repeat_interleave(beams, 0),
                        decoder_input_ids=dec).logits
        return out[:, -1].reshape(b, beams, -1)

    return dict(index=build_index(small_catalog(sizes, 60, 1), device=device), heads=model.lm_head.weight.detach(),
                band_offsets=offsets, step_model=step_model,
                prefill=lambda: step_model.prefill(ids, mask, beam_width=BEAM), reference=reference,
                counted=model.decoder.block[0].layer[2].DenseReluDense, first_positions=BATCH)


CASES = {"tiger": tiger_case, "decoder-only": decoder_only_case,
         "decoder-only-staged": functools.partial(decoder_only_case, staged=True), "t5": t5_case}


def engine_for(case):
    """The GPU engine's code path (eagerly on a CPU), one fixed option per step (no timing)."""
    heads = Heads.build(case["heads"], case["index"].codebook_sizes, case["band_offsets"])
    probe = GpuEngine(case["index"], heads, BEAM, use_graph=False, plan_store=False)
    options = [opts[0] for opts in probe.options_for(BATCH)]
    return GpuEngine(case["index"], heads, BEAM, plan_override=options, use_graph=False, plan_store=False)


class Spy:
    """A step model that records what the loop hands it."""

    def __init__(self, model):
        self.model, self.calls = model, []
        self.hidden_size, self.n_levels, self.batch = model.hidden_size, model.n_levels, model.batch

    def prefill(self, *args, **kwargs):
        return self.model.prefill(*args, **kwargs)

    def step(self, step, tokens, parents):
        self.calls.append((step, tokens, parents))
        return self.model.step(step, tokens, parents)


@pytest.mark.parametrize("name", list(CASES))
@torch.no_grad()
def test_kv_cache_model_in_the_engine_loop_equals_reference(name):
    case = CASES[name]()
    model = case["step_model"]
    case["prefill"]()
    assert is_step_model(model) and not is_step_model(case["reference"])
    want = Decoder(case["index"], case["heads"], BEAM, band_offsets=case["band_offsets"],
                   engine="reference").decode(case["reference"], BATCH)
    engine = engine_for(case)
    got = engine.decode(model, BATCH)                  # plans, then decodes with the step model
    assert torch.equal(got.item_rows, want.item_rows)
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-4)
    assert (got.item_rows >= 0).all()

    # every position goes through the decoder once: the first (the decoder's start, or the
    # history whose last position gives step 0), then one row per beam and later step
    seen = []
    hook = case["counted"].register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[:-1].numel()))
    try:
        case["prefill"]()
        again = engine.decode(model, BATCH)
    finally:
        hook.remove()
    L = case["index"].n_levels
    assert sum(seen) == case["first_positions"] + BATCH * BEAM * (L - 1)
    assert torch.equal(again.item_rows, got.item_rows)

    # the step model reads the previous step's static output buffers, not copies
    spy = Spy(model)
    engine.decode(spy, BATCH)
    shape = engine.shape_state(spy, BATCH)
    assert [c[0] for c in spy.calls] == list(range(L))
    assert spy.calls[0][1:] == (None, None)
    for step, tokens, parents in spy.calls[1:]:
        top = shape.runners[step - 1].top
        assert tokens.data_ptr() == top.tokens.data_ptr() and parents.data_ptr() == top.parents.data_ptr()
        assert tuple(tokens.shape) == tuple(parents.shape) == (BATCH, BEAM)


@torch.no_grad()
def test_reference_decoder_takes_a_step_model_too():
    case = decoder_only_case()
    case["prefill"]()
    for order in ("filter-first", "score-first", "unconstrained"):
        decoder = Decoder(case["index"], case["heads"], BEAM, order=order, band_offsets=case["band_offsets"],
                          engine="reference")
        want = decoder.decode(case["reference"], BATCH)
        got = decoder.decode(case["step_model"], BATCH)
        assert torch.equal(got.tokens, want.tokens), order
        torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-4)
    with pytest.raises(ZeroGRError, match="prefilled with 2 requests, batch_size is 3"):
        decoder.decode(case["step_model"], 3)


def test_loop_names_a_step_model_with_a_wrong_shape():
    class Wrong:
        hidden_size, n_levels, batch = 4, 1, 1

        def prefill(self, *a, **k):
            pass

        def step(self, step, tokens, parents):
            return torch.zeros(3, 4)

    loop = BeamLoop([lambda *a, **k: None], 1, 2, 4, None, torch.device("cpu"))
    with pytest.raises(ZeroGRError, match=r"model.step\(step=0\) returned \(3, 4\), expected \(1, 1, 4\)"):
        loop.run(Wrong())


def test_loop_names_hidden_states_on_another_device():
    """A CPU tensor from the model of a decode on the GPU failed inside a kernel as
    'weight is on cuda:0, expected cpu'; here the meta device stands in for the other device."""
    catalog = Catalog.from_sids(np.array([[0, 1], [1, 0]]), [2, 2])
    for order in ("filter-first", "score-first", "unconstrained"):
        decoder = Decoder(build_index(catalog), [torch.randn(2, 4), torch.randn(2, 4)], 2, order=order)
        with pytest.raises(ZeroGRError, match=r"^hidden_fn\(step=0\) returned a tensor on meta, but the decode runs "
                                              r"on cpu \(the index's device\)$"):
            decoder.decode(lambda step, prefixes: torch.zeros(1, 1, 4, device="meta"), 1)

    class Elsewhere:
        hidden_size, n_levels, batch = 4, 1, 1

        def prefill(self, *a, **k):
            pass

        def step(self, step, tokens, parents):
            return torch.zeros(1, 4, device="meta")

    loop = BeamLoop([lambda *a, **k: None], 1, 2, 4, None, torch.device("cpu"))
    with pytest.raises(ZeroGRError, match=r"^model.step\(step=0\) returned a tensor on meta"):
        loop.run(Elsewhere())


def test_a_new_prefill_shape_changes_the_graph_key():
    """The engine re-captures when a step model's static buffers change (a new history shape)."""
    case = decoder_only_case()
    model = case["step_model"]
    case["prefill"]()
    key = model._static_key
    case["prefill"]()
    assert model._static_key == key
    h = torch.zeros(BATCH, 2, 4, dtype=torch.int64)
    model.prefill(h, None, beam_width=BEAM)
    assert model._static_key != key
