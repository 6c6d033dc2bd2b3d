"""Step models with KV caches: equal to recomputing everything, beams reordered by parent."""
import numpy as np
import pytest
import torch

from zerogr_core import Decoder, build_index
from zerogr_core.errors import ZeroGRError
from zerogr_core.models import PrefixTracker, parents_from_prefixes, safe_parents
from zerogr_core.models.tiger import TigerStepModel


@pytest.fixture(scope="module")
def study():
    from zerogr_core.recsys.train import load_checkpoint

    return load_checkpoint()            # the bundled sample_catalogs/movielens checkpoint


def random_beams(gen, batch, beams_prev, beams, prev_prefixes, level_size, dead=0.15):
    """Random parents (flat rows, some -1) and tokens, and the prefixes they spell."""
    local = torch.randint(0, beams_prev, (batch, beams), generator=gen)
    parents = torch.arange(batch)[:, None] * beams_prev + local
    parents[torch.rand(batch, beams, generator=gen) < dead] = -1
    tokens = torch.randint(0, level_size, (batch, beams), generator=gen)
    tokens[parents < 0] = -1
    kept = prev_prefixes.reshape(batch * beams_prev, -1)[parents.clamp(min=0).view(-1)].view(batch, beams, -1)
    kept = torch.where(parents[..., None] >= 0, kept, -1)
    return parents, tokens, torch.cat([kept, tokens[..., None]], dim=2)


def test_parents_from_prefixes_recovers_parents():
    gen = torch.Generator().manual_seed(0)
    prev = torch.empty(3, 1, 0, dtype=torch.int64)
    parents, _, nxt = random_beams(gen, 3, 1, 5, prev, 50, dead=0.3)
    assert torch.equal(parents_from_prefixes(prev, nxt), parents)
    # distinct prefixes per request: parents are recovered exactly
    prev = torch.stack([torch.randperm(40, generator=gen)[:6].view(6, 1) for _ in range(3)])
    prev = torch.cat([prev, torch.zeros_like(prev)], dim=2)
    prev[1, 4:] = -1
    local = torch.randint(0, 4, (3, 7), generator=gen)
    parents = torch.arange(3)[:, None] * 6 + local
    parents[0, 2] = -1
    kept = prev.reshape(18, 2)[parents.clamp(min=0).view(-1)].view(3, 7, 2)
    tokens = torch.arange(21).view(3, 7)
    tokens[0, 2] = -1
    nxt = torch.cat([torch.where(parents[..., None] >= 0, kept, -1), tokens[..., None]], dim=2)
    assert torch.equal(parents_from_prefixes(prev, nxt), parents)
    assert torch.equal(safe_parents(parents, 6)[2], torch.tensor(0))


@pytest.mark.parametrize("beam", [5])
def test_tiger_kv_cache_equals_recompute(study, beam):
    """Every step of the KV-cache model equals ``hidden_fn_for`` on the bundled checkpoint."""
    model, sids = study.model, study.sids
    histories = [np.arange(3, 40), np.array([7]), np.arange(100, 112), np.arange(5, 70, 3)]
    ref = model.hidden_fn_for(histories, sids)
    step_model = TigerStepModel(model)
    step_model.prefill_rows(histories, sids, beam_width=beam)
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):                                 # a second decode reuses the buffers
        batch = len(histories)
        prefixes = torch.empty(batch, 1, 0, dtype=torch.int64)
        got = step_model.step(0, None, None)
        torch.testing.assert_close(got.view(batch, 1, -1), ref(0, prefixes), rtol=1e-5, atol=1e-5)
        beams_prev = 1
        for step in range(1, model.n_levels):
            parents, tokens, prefixes = random_beams(gen, batch, beams_prev, beam, prefixes,
                                                     model.codebook_sizes[step - 1])
            got = step_model.step(step, tokens, parents).view(batch, beam, -1)
            want = ref(step, prefixes)
            alive = (prefixes >= 0).all(dim=2)        # a beam whose whole ancestry is filled
            assert alive.sum() > batch
            torch.testing.assert_close(got[alive], want[alive], rtol=1e-5, atol=1e-5)
            beams_prev = beam


def test_tiger_kv_cache_decodes_like_hidden_fn(study):
    model, sids = study.model, study.sids
    histories = [np.arange(3, 30), np.array([11, 12]), np.arange(200, 260)]
    index = build_index(study.catalog)
    for order in ("filter-first", "score-first"):
        decoder = Decoder(index, model.head_weights(), 16, order=order)
        want = decoder.decode(model.hidden_fn_for(histories, sids), len(histories))
        step_model = TigerStepModel(model)
        step_model.prefill_rows(histories, sids, beam_width=16)
        got = decoder.decode(PrefixTracker(step_model), len(histories))
        assert torch.equal(got.item_rows, want.item_rows)
        torch.testing.assert_close(got.scores, want.scores, rtol=1e-5, atol=1e-5)


def test_tiger_prefill_errors(study):
    step_model = TigerStepModel(study.model)
    with pytest.raises(ZeroGRError, match="history: expected shape"):
        step_model.prefill(torch.zeros(2, 3, dtype=torch.int64), beam_width=4)
    with pytest.raises(ZeroGRError, match="right padding"):
        step_model.prefill(torch.zeros(2, 3, 4, dtype=torch.int64), torch.tensor([[0, 1, 1], [1, 1, 0]]),
                           beam_width=4)
    with pytest.raises(ZeroGRError, match="prefill before step"):
        TigerStepModel(study.model).step(0, None, None)


def decoder_only(dtype=torch.float32):
    from zerogr_core.models.decoder_only import DecoderOnlyConfig, DecoderOnlyRecommender

    torch.manual_seed(0)
    return DecoderOnlyRecommender(DecoderOnlyConfig.preset("tiny", (6, 7, 5, 4))).to(dtype)


def left_padded(gen, lengths, levels=(6, 7, 5, 4)):
    t = max(lengths)
    history = torch.stack([torch.randint(0, v, (len(lengths), t), generator=gen) for v in levels], dim=2)
    mask = torch.arange(t)[None, :] >= t - torch.tensor(lengths)[:, None]
    return torch.where(mask[..., None], history, 0), mask


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 6e-2), (torch.float16, 1e-2)])
def test_decoder_only_kv_cache_equals_recompute(dtype, tol, staged):
    """Prefilled, or staged (history pass at step 0, padded to a bucket of 12 positions)."""
    model = decoder_only(dtype)
    gen = torch.Generator().manual_seed(0)
    history, mask = left_padded(gen, [5, 1, 9])
    batch, beam = 3, 4
    step_model = model.step_model(history_bucket=4)
    (step_model.stage if staged else step_model.prefill)(history, mask, beam_width=beam)
    assert step_model.history_in_step == staged
    prefixes = torch.empty(batch, 1, 0, dtype=torch.int64)
    got = step_model.step(0, None, None)
    torch.testing.assert_close(got.float(), model.recompute_hidden(history, mask, prefixes)[:, 0].float(),
                               rtol=tol, atol=tol)
    beams_prev = 1
    for step in range(1, model.n_levels):
        parents, tokens, prefixes = random_beams(gen, batch, beams_prev, beam, prefixes,
                                                 model.config.codebook_sizes[step - 1])
        got = step_model.step(step, tokens, parents).view(batch, beam, -1)
        want = model.recompute_hidden(history, mask, prefixes)
        alive = (prefixes >= 0).all(dim=2)
        torch.testing.assert_close(got[alive].float(), want[alive].float(), rtol=tol, atol=tol)
        beams_prev = beam


def test_decoder_only_hugging_face_twin_has_the_same_logits():
    """``to_hf()`` copies the network into GPT2LMHeadModel: fed the history as item embeddings
    with its left-padding mask, and then SID tokens, it scores every level as the model does,
    through ``generate``'s own position and cache handling."""
    pytest.importorskip("transformers")
    model = decoder_only()
    hf = model.to_hf()
    gen = torch.Generator().manual_seed(4)
    history, mask = left_padded(gen, [5, 2, 9])
    head = model.head.detach()
    prefixes = torch.stack([torch.randint(0, v, (3, 1), generator=gen) for v in (6, 7, 5)], dim=2)   # (3, 1, 3)
    embeds = model.item_embedding(history)
    for level in range(model.n_levels):
        tokens = (prefixes[:, 0, :level] + torch.tensor(model.band_offsets[:level])).long()
        x = torch.cat([embeds, hf.transformer.wte(tokens)], dim=1)
        att = torch.cat([mask.long(), torch.ones(3, level, dtype=torch.long)], dim=1)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            theirs = hf(inputs_embeds=x, attention_mask=att, position_ids=pos).logits[:, -1]
            mine = model.recompute_hidden(history, mask, prefixes[:, :, :level])[:, 0] @ head.T
        torch.testing.assert_close(theirs, mine, rtol=1e-5, atol=1e-5)
    # generate() with a prefix function returns catalog items; with a beam as wide as the catalog
    # the search is exhaustive, so its best sequence is the item of highest full-vocabulary
    # log-probability (Hugging Face normalises over the whole vocabulary, then masks).
    from zerogr_core.bench.e2e import CatalogPrefixes
    from zerogr_core import Catalog

    sids = np.unique(torch.stack([torch.randint(0, v, (40,), generator=gen) for v in (6, 7, 5, 4)], dim=1).numpy(),
                     axis=0)
    catalog = Catalog.from_sids(sids, (6, 7, 5, 4))
    allowed = CatalogPrefixes(catalog, model.band_offsets, start=0)
    n = catalog.n_items
    with torch.no_grad():
        out = hf.generate(inputs_embeds=embeds, attention_mask=mask.long(), num_beams=n, num_return_sequences=n,
                          do_sample=False, max_new_tokens=4, min_new_tokens=4, length_penalty=0.0,
                          prefix_allowed_tokens_fn=allowed)
    assert out.shape == (3 * n, 4) and allowed.valid(out) == 1.0
    # Brute force: every catalog item's full-vocabulary log-probability under the model.
    rows = torch.from_numpy(catalog.sids.astype(np.int64))
    for b in range(3):
        total = torch.zeros(n)
        for level in range(4):
            hidden = model.recompute_hidden(history[b:b + 1], mask[b:b + 1], rows[None, :, :level])[0]
            logp = torch.log_softmax(hidden @ head.T, dim=-1)
            total += logp[torch.arange(n), rows[:, level] + model.band_offsets[level]]
        best = rows[int(total.argmax())] + torch.tensor(model.band_offsets)
        assert torch.equal(out[b * n], best), (b, out[b * n], best)


def test_decoder_only_padding_does_not_change_outputs():
    model = decoder_only()
    gen = torch.Generator().manual_seed(2)
    history, mask = left_padded(gen, [3, 8])
    alone = model.step_model()
    alone.prefill(history[:1, -3:], None, beam_width=2)
    batched = model.step_model()
    batched.prefill(history, mask, beam_width=2)
    torch.testing.assert_close(batched.step(0, None, None)[:1], alone.step(0, None, None), rtol=1e-5, atol=1e-5)
    tokens, parents = torch.tensor([[1, 4], [0, 2]]), torch.tensor([[0, 0], [1, 1]])
    torch.testing.assert_close(batched.step(1, tokens, parents)[:2],
                               alone.step(1, tokens[:1], parents[:1]), rtol=1e-5, atol=1e-5)


def test_decoder_only_decodes_catalog_items():
    from zerogr_core import Catalog

    model = decoder_only()
    gen = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(0)
    sids = np.unique(np.stack([rng.integers(0, v, 300) for v in (6, 7, 5, 4)], axis=1), axis=0)
    catalog = Catalog.from_sids(sids, (6, 7, 5, 4))
    history, mask = left_padded(gen, [4, 2])
    step_model = model.step_model()
    step_model.prefill(history, mask, beam_width=8)
    decoder = Decoder(build_index(catalog), model.head_weight(), 8, band_offsets=model.band_offsets)
    result = decoder.decode(PrefixTracker(step_model), 2)
    assert (result.item_rows >= 0).all()
    assert np.array_equal(catalog.sids[result.item_rows.numpy()].astype(np.int64), result.tokens.numpy())


def test_decoder_only_deployable_preset():
    from zerogr_core.models.decoder_only import DecoderOnlyConfig, DecoderOnlyRecommender

    config = DecoderOnlyConfig.preset("deployable", (256,) * 4)
    assert (config.n_layers, config.d_model, config.max_history) == (12, 1024, 256)
    with torch.device("meta"):
        model = DecoderOnlyRecommender(config)
    assert 150e6 < sum(p.numel() for p in model.parameters()) < 160e6
    with pytest.raises(ZeroGRError, match="unknown decoder-only preset"):
        DecoderOnlyConfig.preset("huge", (4,))
    with pytest.raises(ZeroGRError, match="padding on the left"):
        decoder_only().step_model().prefill(torch.zeros(2, 3, 4, dtype=torch.int64),
                                            torch.tensor([[1, 1, 0], [1, 1, 1]]), beam_width=2)


def _two_steps(step_model, beam):
    tokens = torch.zeros(step_model.batch, beam, dtype=torch.int64)
    parents = torch.arange(step_model.batch)[:, None].expand(-1, beam).contiguous()
    return step_model.step(0, None, None).clone(), step_model.step(1, tokens, parents).clone()


def test_prefill_of_the_same_shape_reuses_the_buffers(study):
    """A second prefill of the same shape writes into the first one's tensors (what a
    captured CUDA graph reads) and serves the new requests like a fresh model."""
    model = decoder_only()
    gen = torch.Generator().manual_seed(4)
    (h1, m1), (h2, m2) = left_padded(gen, [2, 5]), left_padded(gen, [5, 3])
    tiger_rows = ([np.arange(3, 9), np.arange(20, 26)], [np.arange(40, 46), np.arange(50, 56)])
    cases = [(model.step_model, lambda s, i: s.prefill(*((h1, m1), (h2, m2))[i], beam_width=3), "history_kv"),
             (lambda: TigerStepModel(study.model),
              lambda s, i: s.prefill_rows(tiger_rows[i], study.sids, beam_width=3), "cross_kv")]
    for make, fill, name in cases:
        kept = make()
        fill(kept, 0)
        ptr = getattr(kept, name)[0][0].data_ptr()
        fill(kept, 1)
        assert getattr(kept, name)[0][0].data_ptr() == ptr
        fresh = make()
        fill(fresh, 1)
        for got, want in zip(_two_steps(kept, 3), _two_steps(fresh, 3)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
