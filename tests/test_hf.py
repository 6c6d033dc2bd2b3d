"""The Hugging Face adapter against HF ``generate`` and a brute-force beam search."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from zerogr_core import Catalog, Decoder, build_index  # noqa: E402
from zerogr_core.errors import ZeroGRError  # noqa: E402
from zerogr_core.hf import generate  # noqa: E402

SIZES = (4, 5, 6)
OFFSETS = (3, 7, 12)           # ids 0-2: pad, eos, unk; then the three SID levels
VOCAB = 20


def tiny_catalog(n=40, seed=0):
    rng = np.random.default_rng(seed)
    sids = set()
    while len(sids) < n:
        sids.add(tuple(int(rng.integers(0, s)) for s in SIZES))
    return Catalog.from_sids(np.array(sorted(sids)), SIZES)


def t5_model():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                                   dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(config).eval()


def gpt2_model():
    torch.manual_seed(1)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=64,
                                     bos_token_id=2, eos_token_id=1, pad_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def llama_model():
    torch.manual_seed(2)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      bos_token_id=2, eos_token_id=1, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


MODELS = {"t5": t5_model, "gpt2": gpt2_model, "llama": llama_model}


def inputs():
    """Two requests of different lengths (left padding)."""
    ids = torch.tensor([[0, 0, 5, 9, 13, 4], [8, 15, 6, 10, 3, 17]])
    mask = (torch.arange(6)[None, :] >= torch.tensor([[2], [0]])).long()
    return ids, mask


@torch.no_grad()
def next_logprobs(model, ids, mask, prefix_ids):
    """Full-vocabulary log-probabilities after ``prefix_ids``, no cache (recomputed)."""
    if model.config.is_encoder_decoder:
        dec = torch.tensor([[model.config.decoder_start_token_id, *prefix_ids]])
        logits = model(input_ids=ids[None], attention_mask=mask[None], decoder_input_ids=dec).logits
    else:
        full = torch.cat([ids, torch.tensor(prefix_ids, dtype=torch.int64)])[None]
        m = torch.cat([mask, torch.ones(len(prefix_ids), dtype=torch.int64)])[None]
        pos = (m.cumsum(1) - 1).masked_fill(m == 0, 0)
        logits = model(input_ids=full, attention_mask=m, position_ids=pos).logits
    return torch.log_softmax(logits[0, -1].double(), dim=-1)


def brute_force(model, catalog, ids, mask, beam, order):
    """Plain beam search over the catalog's prefix tree with recomputed logits."""
    sids = [tuple(int(t) for t in row) for row in catalog.sids]
    beams = [((), 0.0)]
    for level in range(catalog.n_levels):
        cands = []
        for prefix, score in beams:
            children = sorted({s[level] for s in sids if s[:level] == prefix})
            lp = next_logprobs(model, ids, mask, [OFFSETS[i] + t for i, t in enumerate(prefix)])
            band = torch.tensor([OFFSETS[level] + t for t in children])
            vals = lp[band] if order == "score-first" else torch.log_softmax(lp[band], dim=0)
            cands += [(prefix + (t,), score + float(v)) for t, v in zip(children, vals)]
        beams = sorted(cands, key=lambda c: -c[1])[:beam]
    return beams


@pytest.mark.parametrize("name", ["t5", "gpt2", "llama"])
@pytest.mark.parametrize("order", ["filter-first", "score-first"])
def test_generate_matches_brute_force(name, order):
    model, catalog = MODELS[name](), tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    for beam in (6, 48):                  # 48 ≥ the 40 items: beam search is exhaustive
        result = generate(model, ids, index, beam_width=beam, token_offsets=OFFSETS, order=order,
                          attention_mask=mask)
        for r in range(ids.shape[0]):
            want = brute_force(model, catalog, ids[r][mask[r] > 0], mask[r][mask[r] > 0], beam, order)
            assert_request_is(result, r, want, catalog)


def assert_request_is(result, r: int, want, catalog) -> None:
    """Request ``r`` of a decode returned exactly ``want`` ([(sid tuple, score)], best first):
    its live beams, their tokens and scores (1e-4), and catalog rows holding those SIDs."""
    alive = result.scores[r] > float("-inf")
    assert int(alive.sum()) == len(want)
    got = [tuple(t) for t in result.tokens[r][alive].tolist()]
    assert got == [w[0] for w in want]
    np.testing.assert_allclose(result.scores[r][alive].numpy(), [w[1] for w in want], rtol=1e-4, atol=1e-4)
    rows = result.item_rows[r][alive].numpy()
    assert (rows >= 0).all()
    assert np.array_equal(catalog.sids[rows].astype(np.int64), np.array(got))


def allowed_next(sids, offsets) -> dict:
    """Vocabulary ids of every valid next SID token after each prefix of vocabulary ids: the
    table a ``prefix_allowed_tokens_fn`` looks up, built here independently of the index."""
    prefixes = {}
    for row in sids:
        for level in range(len(row)):
            key = tuple(offsets[i] + int(t) for i, t in enumerate(row[:level]))
            prefixes.setdefault(key, set()).add(offsets[level] + int(row[level]))
    return prefixes


@pytest.mark.parametrize("name", ["t5", "gpt2"])
def test_score_first_equals_hf_generate(name):
    """Same beams and scores as HF generate(num_beams=M, prefix_allowed_tokens_fn=...) in FP32."""
    model, catalog = MODELS[name](), tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    L, beam = catalog.n_levels, 8
    prefixes = allowed_next(catalog.sids, OFFSETS)
    start = 1 if model.config.is_encoder_decoder else ids.shape[1]

    def allowed(batch_id, sent):
        return sorted(prefixes.get(tuple(sent[start:].tolist()), ()))

    out = model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, num_return_sequences=beam,
                         prefix_allowed_tokens_fn=allowed, do_sample=False, length_penalty=0.0, early_stopping=True,
                         max_new_tokens=L, min_new_tokens=L, return_dict_in_generate=True, output_scores=True)
    hf_seq = out.sequences[:, start:].view(ids.shape[0], beam, L) - torch.tensor(OFFSETS)
    hf_scores = out.sequences_scores.view(ids.shape[0], beam)
    result = generate(model, ids, index, beam_width=beam, token_offsets=OFFSETS, order="score-first",
                      attention_mask=mask)
    for r in range(ids.shape[0]):
        real = hf_scores[r] > -1e8        # HF pads short requests with beams scored about -1e9
        alive = result.scores[r] > float("-inf")
        assert torch.equal(real, alive)
        assert torch.equal(result.tokens[r][alive], hf_seq[r][real])
        torch.testing.assert_close(result.scores[r][alive], hf_scores[r][real], rtol=1e-5, atol=1e-5)


def test_generate_errors():
    model, catalog = t5_model(), tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    with pytest.raises(ZeroGRError, match=r"token_offsets: level 3 needs vocabulary ids \[16, 22\) but the "
                                          r"model's vocabulary has 20 ids"):
        generate(model, ids, index, beam_width=4, token_offsets=(3, 7, 16))
    with pytest.raises(ZeroGRError, match="3 levels"):
        generate(model, ids, index, beam_width=4, token_offsets=(3, 7))
    with pytest.raises(ZeroGRError, match="attention_mask: shape"):
        generate(model, ids, index, beam_width=4, token_offsets=OFFSETS, attention_mask=mask[:, 1:])
    with pytest.raises(ZeroGRError, match="order must be"):
        generate(model, ids, index, beam_width=4, token_offsets=OFFSETS, order="best-first")
    # int() truncated 3.7 to 3 and True to 1: level 1's ids moved, and the decode ran on them silently
    for bad in ((3.7, 7, 12), (True, 7, 12), ("3", 7, 12)):
        with pytest.raises(ZeroGRError, match=r"^token_offsets: expected one integer per SID level, got "):
            generate(model, ids, index, beam_width=4, token_offsets=bad)
    whole = generate(model, ids, index, beam_width=4, token_offsets=(3.0, np.int64(7), torch.tensor(12)))
    assert torch.equal(whole.item_rows, generate(model, ids, index, beam_width=4, token_offsets=OFFSETS).item_rows)


@pytest.mark.parametrize("name", ["t5", "gpt2", "t5-step", "t5-staged"])
def test_request_errors_name_the_argument(name):
    """Ids outside the vocabulary raised torch's 'index out of range in self' from the embedding (on a
    GPU: a device-side assert), float ids its 'Expected tensor for argument #1 'indices'...', a list
    mask 'list' object has no attribute 'to', and an empty batch a reshape error inside T5; staged
    into the T5 step model's int64 buffers float ids were truncated silently."""
    from zerogr_core.hf import HFGenerator
    from zerogr_core.models.t5 import T5StepModel

    model = (gpt2_model if name == "gpt2" else t5_model)()
    index = build_index(tiny_catalog())
    step_model = T5StepModel(model, OFFSETS) if name.startswith("t5-") else None
    generator = HFGenerator(model, index, beam_width=4, token_offsets=OFFSETS, step_model=step_model,
                            prefill="inside" if name == "t5-staged" else "auto")
    ids, mask = inputs()
    for bad_ids, message in ((ids.clone().index_fill_(1, torch.tensor([0]), VOCAB), r"row 0 has ids outside the "
                              r"model's vocabulary \[0, 20\)$"),
                             (torch.where(ids == ids[1, 0], -1, ids), r"row 1 has ids outside"),
                             (ids.float(), r"token ids must be integers, got float32$"),
                             (ids[:0], r"expected a tensor of shape \(batch ≥ 1, T ≥ 1\), got \(0, \d+\)$")):
        with pytest.raises(ZeroGRError, match=r"^input_ids: " + message):
            generator.generate(bad_ids, mask)
    with pytest.raises(ZeroGRError, match=r"^attention_mask: expected a torch.Tensor, got list$"):
        generator.generate(ids, mask.tolist())
    # a GPT-2 summed the mask into positions: a mask of 2s moved every position, other beams silently
    for bad_mask, value in ((mask * 2, "2"), (mask * 0.5, "0.5")):
        with pytest.raises(ZeroGRError, match=rf"^attention_mask: values must be 0 \(padding\) or 1 \(token\), "
                                              rf"got {value}$"):
            generator.generate(ids, bad_mask)
    assert torch.equal(generator.generate(ids, mask.bool()).item_rows, generator.generate(ids, mask).item_rows)
    assert generator.generate(ids.to(torch.int32), mask).item_rows.shape == (ids.shape[0], 4)


@pytest.mark.parametrize("masked", [False, True])
def test_t5_deferred_range_check(monkeypatch, masked):
    """T5's staged prefill checks ids on the model's GPU after the launch (StagedRange), here forced on
    the CPU: a bad id raises the one-line error naming its row, the clamped encoder never indexes past
    the table, and the next decode is unharmed and equal to the one checked first."""
    import zerogr_core.models.t5 as t5
    from zerogr_core.hf import HFGenerator

    model, index = t5_model(), build_index(tiny_catalog())
    ids, mask = inputs()
    mask = mask if masked else None
    make = lambda: HFGenerator(model, index, beam_width=4, token_offsets=OFFSETS,  # noqa: E731
                               step_model=t5.T5StepModel(model, OFFSETS), prefill="inside")
    want = make().generate(ids, mask)
    monkeypatch.setattr(t5, "defers_range", lambda history, device: True)
    generator = make()
    for value, row in ((VOCAB, 1), (-2, 0)):
        bad = ids.clone()
        bad[row, -1] = value
        with pytest.raises(ZeroGRError, match=rf"^input_ids: row {row} has ids outside the model's vocabulary "
                                              rf"\[0, {VOCAB}\)$"):
            generator.generate(bad, mask)
        assert not generator.step_model._range.pending
        got = generator.generate(ids, mask)
        assert torch.equal(got.item_rows, want.item_rows)
        torch.testing.assert_close(got.scores, want.scores)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("name", ["t5", "gpt2", "t5-staged"])
def test_cuda_ids_outside_the_vocabulary_are_refused(name):
    """Ids already on the GPU were not range-checked for these models: a bad one ended the process's
    CUDA context in the embedding's device-side assert. Now the one-line error, and the next decode
    on the same GPU gives the same beams as before it."""
    from zerogr_core.hf import HFGenerator
    from zerogr_core.models.t5 import T5StepModel

    model = (gpt2_model if name == "gpt2" else t5_model)().to("cuda")
    index = build_index(tiny_catalog(), device="cuda")
    step_model = T5StepModel(model, OFFSETS) if name == "t5-staged" else None
    generator = HFGenerator(model, index, beam_width=4, token_offsets=OFFSETS, step_model=step_model,
                            prefill="inside" if name == "t5-staged" else "auto")
    ids, mask = (t.cuda() for t in inputs())
    first = [generator.generate(ids, mask) for _ in range(2)][-1]
    for value, row in ((VOCAB, 1), (-1, 0)):
        bad = ids.clone()
        bad[row, -1] = value
        with pytest.raises(ZeroGRError, match=rf"^input_ids: row {row} has ids outside the model's vocabulary"):
            generator.generate(bad, mask)
        torch.cuda.synchronize()
        again = generator.generate(ids, mask)
        assert torch.equal(again.item_rows, first.item_rows)
        torch.testing.assert_close(again.scores, first.scores)


def test_import_without_transformers():
    """``import zerogr_core`` and ``zerogr_core.hf`` load without importing transformers."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['transformers'] = None; import zerogr_core, zerogr_core.hf, zerogr_core.models; "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def gated_t5_model():
    torch.manual_seed(3)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=24, d_kv=8, d_ff=40, num_layers=1, num_decoder_layers=3,
                                   num_heads=3, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                                   feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(config).eval()


@pytest.mark.parametrize("make", [t5_model, gated_t5_model])
def test_t5_step_model_equals_hf_cache(make):
    """Per-request cross-attention memory + static self-attention cache = HF's own caches, every step."""
    from zerogr_core.hf import HFStepModel
    from zerogr_core.models.t5 import T5StepModel

    model = make()
    ids, mask = inputs()
    beam = 5
    ours, theirs = T5StepModel(model, OFFSETS), HFStepModel(model, OFFSETS)
    for m in (ours, theirs):
        m.prefill(ids, mask, beam_width=beam)
    gen = torch.Generator().manual_seed(0)
    torch.testing.assert_close(ours.step(0, None, None), theirs.step(0, None, None), rtol=1e-5, atol=1e-5)
    prev = 1
    for step in range(1, len(OFFSETS)):
        local = torch.randint(0, prev, (2, beam), generator=gen)
        parents = torch.arange(2)[:, None] * prev + local
        tokens = torch.randint(0, SIZES[step - 1], (2, beam), generator=gen).int()   # as TopkOut.tokens
        torch.testing.assert_close(ours.step(step, tokens, parents), theirs.step(step, tokens, parents),
                                   rtol=1e-5, atol=1e-5)
        prev = beam


def test_generate_with_t5_step_model():
    from zerogr_core.hf import HFGenerator
    from zerogr_core.models.t5 import T5StepModel

    model, catalog = t5_model(), tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    want = generate(model, ids, index, beam_width=6, token_offsets=OFFSETS, attention_mask=mask)
    fast = HFGenerator(model, index, beam_width=6, token_offsets=OFFSETS, step_model=T5StepModel(model, OFFSETS))
    got = fast.generate(ids, mask)
    assert torch.equal(got.item_rows, want.item_rows)
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-5, atol=1e-5)


def test_step_model_offsets_must_match():
    """A step model built with other offsets fed its tokens back at ids the heads never scored,
    and the decode returned other beams, silently."""
    from zerogr_core.hf import HFGenerator
    from zerogr_core.models.t5 import T5StepModel

    model, index = t5_model(), build_index(tiny_catalog())
    with pytest.raises(ZeroGRError, match=r"^step_model: its token_offsets \(4, 8, 13\) differ from token_offsets "
                                          r"\(3, 7, 12\)$"):
        HFGenerator(model, index, beam_width=4, token_offsets=OFFSETS, step_model=T5StepModel(model, (4, 8, 13)))


@pytest.mark.parametrize("given", [(4, 8, 13), None])
def test_step_decoder_offsets_must_match(given):
    """Only HFGenerator compared the step model's offsets with the heads' bands: a StepDecoder built
    directly with band_offsets (4, 8, 13), or none (a shared head's default, the cumulative codebook
    sizes), for a step model feeding tokens back at (3, 7, 12) decoded other items, silently."""
    from zerogr_core.models.protocol import StepDecoder
    from zerogr_core.models.t5 import T5StepModel

    model, index = t5_model(), build_index(tiny_catalog())
    head = model.get_output_embeddings().weight.detach()
    bands = (r"band_offsets \(4, 8, 13\)" if given else
             r"band_offsets \(left out: cumulative codebook sizes\) \(0, 4, 9\)")
    with pytest.raises(ZeroGRError, match=rf"^step_model: its token_offsets \(3, 7, 12\) differ from {bands}$"):
        StepDecoder(T5StepModel(model, OFFSETS), index, head, beam_width=4, band_offsets=given)
    # per-level heads start at their own row 0: nothing to compare, and the bands sliced right decode as generate
    ids, mask = inputs()
    sliced = [head[o:o + s] for o, s in zip(OFFSETS, SIZES)]
    got = StepDecoder(T5StepModel(model, OFFSETS), index, sliced, beam_width=4).decode(ids, mask)
    want = generate(model, ids, index, beam_width=4, token_offsets=OFFSETS, attention_mask=mask)
    assert torch.equal(got.item_rows, want.item_rows)


def test_decoder_decode_checks_a_step_models_offsets():
    """``Decoder.decode`` with a prefilled step model (the documented way to drive one without
    StepDecoder) took any offsets: a T5 step model feeding tokens back at (3, 7, 12) under a shared
    head banded at (4, 8, 13) decoded other items, silently. Matching offsets decode as generate."""
    from zerogr_core.models.t5 import T5StepModel

    model, index = t5_model(), build_index(tiny_catalog())
    head = model.get_output_embeddings().weight.detach()
    ids, mask = inputs()
    step = T5StepModel(model, OFFSETS)
    step.prefill(ids, mask, beam_width=4)
    wrong = Decoder(index, head, 4, band_offsets=(4, 8, 13), engine="reference")
    with pytest.raises(ZeroGRError, match=r"^step_model: its token_offsets \(3, 7, 12\) differ from band_offsets "
                                          r"\(4, 8, 13\)$"):
        wrong.decode(step, ids.shape[0])
    got = Decoder(index, head, 4, band_offsets=OFFSETS, engine="reference").decode(step, ids.shape[0])
    want = generate(model, ids, index, beam_width=4, token_offsets=OFFSETS, attention_mask=mask)
    assert torch.equal(got.item_rows, want.item_rows)


def test_generator_reuses_static_buffers_across_batches():
    """A kept generator serves new requests of the same shape (new data in the same buffers)
    and of a new shape exactly as a fresh generator does."""
    from zerogr_core.hf import HFGenerator
    from zerogr_core.models.t5 import T5StepModel

    model, catalog = t5_model(), tiny_catalog()
    index = build_index(catalog)

    def fresh(ids, mask):
        return HFGenerator(model, index, beam_width=5, token_offsets=OFFSETS,
                           step_model=T5StepModel(model, OFFSETS)).generate(ids, mask)

    kept = HFGenerator(model, index, beam_width=5, token_offsets=OFFSETS, step_model=T5StepModel(model, OFFSETS))
    ids, mask = inputs()
    gen = torch.Generator().manual_seed(5)
    batches = [(ids, mask), (torch.randint(3, VOCAB, ids.shape, generator=gen), torch.ones_like(mask)),
               (ids[:1, 2:], mask[:1, 2:]), (ids, mask)]
    for i, m in batches:
        got, want = kept.generate(i, m), fresh(i, m)
        assert torch.equal(got.item_rows, want.item_rows)
        torch.testing.assert_close(got.scores, want.scores)


def test_t5_step_model_bf16():
    from zerogr_core.hf import HFStepModel
    from zerogr_core.models.t5 import T5StepModel

    model = t5_model().to(torch.bfloat16)
    ids, mask = inputs()
    ours, theirs = T5StepModel(model, OFFSETS), HFStepModel(model, OFFSETS)
    for m in (ours, theirs):
        m.prefill(ids, mask, beam_width=3)
    assert ours.step(0, None, None).dtype == torch.bfloat16
    torch.testing.assert_close(ours.step(0, None, None).float(), theirs.step(0, None, None).float(),
                               rtol=3e-2, atol=3e-2)
    tokens, parents = torch.tensor([[0, 3, 1], [2, 2, 0]]), torch.tensor([[0, 0, 0], [1, 1, 1]])
    torch.testing.assert_close(ours.step(1, tokens, parents).float(), theirs.step(1, tokens, parents).float(),
                               rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("name", ["t5", "gpt2", "llama"])
def test_padded_requests_get_the_beams_they_get_alone(name):
    """Histories of different lengths in one batch: the attention mask hides the padding."""
    model, catalog = MODELS[name](), tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    batched = generate(model, ids, index, beam_width=5, token_offsets=OFFSETS, attention_mask=mask)
    for r in range(ids.shape[0]):
        keep = mask[r].bool()
        alone = generate(model, ids[r:r + 1, keep], index, beam_width=5, token_offsets=OFFSETS)
        assert torch.equal(batched.item_rows[r], alone.item_rows[0]), r
        torch.testing.assert_close(batched.scores[r], alone.scores[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_right_padding_of_a_causal_lm_is_refused(name):
    """A causal LM continues from the last position: a right-padded request continued from its
    padding and returned other beams than alone, silently; T5's encoder takes either padding."""
    ids = torch.tensor([[5, 9, 13, 4, 0, 0], [8, 15, 6, 10, 3, 17]])
    mask = (ids > 0).long()
    index = build_index(tiny_catalog())
    with pytest.raises(ZeroGRError, match=r"^attention_mask: row 0 ends in padding; a decoder-only model continues "
                                          r"from the last position, so pad on the left$"):
        generate(MODELS[name](), ids, index, beam_width=5, token_offsets=OFFSETS, attention_mask=mask)
    right = generate(t5_model(), ids, index, beam_width=5, token_offsets=OFFSETS, attention_mask=mask)
    alone = generate(t5_model(), ids[:1, :4], index, beam_width=5, token_offsets=OFFSETS)
    assert torch.equal(right.item_rows[0], alone.item_rows[0])


@pytest.mark.parametrize("name", ["t5", "llama"])
@pytest.mark.parametrize("order", ["filter-first", "score-first"])
def test_generate_in_bf16(name, order):
    model, catalog = MODELS[name]().to(torch.bfloat16), tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    result = generate(model, ids, index, beam_width=6, token_offsets=OFFSETS, order=order, attention_mask=mask)
    assert result.scores.dtype == torch.float32 and torch.isfinite(result.scores).all()
    assert (result.scores[:, :-1] >= result.scores[:, 1:]).all()
    assert (result.item_rows >= 0).all()
    assert np.array_equal(catalog.sids[result.item_rows.numpy()].astype(np.int64), result.tokens.numpy())


@pytest.mark.parametrize("kind", ["hf", "t5"])
def test_step_model_checks_token_offsets(kind):
    """Built directly (not through generate/HFGenerator, which check them), a step model took
    offsets past the vocabulary: (3, 20, 12) failed at step 2, feeding level 2's token back, with
    torch's 'index out of range in self' (on a GPU a device-side assert); 3.7 was truncated to 3."""
    from zerogr_core.hf import HFStepModel
    from zerogr_core.models.t5 import T5StepModel

    make = HFStepModel if kind == "hf" else T5StepModel
    model = t5_model()
    for bad, message in (((3, 20, 12), r"level 2 starts at id 20, outside the model's vocabulary \[0, 20\)"),
                         ((3, 7, 25), r"level 3 starts at id 25, outside the model's vocabulary \[0, 20\)"),
                         ((-1, 7, 12), r"level 1 starts at id -1, outside the model's vocabulary \[0, 20\)"),
                         ((3.7, 7, 12), r"expected one integer per SID level, got \(3.7, 7, 12\)"),
                         ((), r"expected one integer per SID level, got \(\)")):
        with pytest.raises(ZeroGRError, match=rf"^token_offsets: {message}$"):
            make(model, bad)
    assert make(model, (3.0, np.int64(7), torch.tensor(12))).token_offsets == OFFSETS


def bart_model(d_model=16):
    torch.manual_seed(3)
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=d_model, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=0, bos_token_id=2,
                                     eos_token_id=1, decoder_start_token_id=1, forced_eos_token_id=None)
    return transformers.BartForConditionalGeneration(config).eval()


def test_final_logits_bias_is_refused():
    """BART-style models (Marian, mBART, Pegasus, …) add final_logits_bias after the output projection.
    Reading the hidden states, the adapter had the model add it to them: 'The size of tensor a (16) must
    match the size of tensor b (20)' from inside its forward (with a hidden size equal to the vocabulary,
    a non-zero bias would have shifted them silently), and output_head handed a custom step model's
    decoder a head whose logits missed the bias. A zero bias changes no logit but is still added to
    the hidden states, so the step model refuses it too."""
    from zerogr_core.hf import HFStepModel
    from zerogr_core.models.hf import hidden_outputs, output_head

    model, index = bart_model(), build_index(tiny_catalog())
    ids, mask = inputs()
    assert not model.final_logits_bias.any()
    assert output_head(model)[2] is model.get_output_embeddings().weight
    zero = (r"^model: BartForConditionalGeneration adds final_logits_bias to its output projection's output "
            r"\(zero or not\), so the adapter cannot read the hidden states it projects$")
    with pytest.raises(ZeroGRError, match=zero):
        HFStepModel(model, OFFSETS)
    with pytest.raises(ZeroGRError, match=zero):
        generate(model, ids, index, beam_width=4, token_offsets=OFFSETS, attention_mask=mask)
    with pytest.raises(ZeroGRError, match=zero), hidden_outputs(model):
        pass
    # the head is the user's still: nothing was switched
    assert "forward" not in vars(model.get_output_embeddings())
    with torch.no_grad():
        model.final_logits_bias[0, 5] = 0.5
    for call in (lambda: output_head(model), lambda: HFStepModel(model, OFFSETS),
                 lambda: generate(model, ids, index, beam_width=4, token_offsets=OFFSETS, attention_mask=mask)):
        with pytest.raises(ZeroGRError, match=r"^model: BartForConditionalGeneration adds a non-zero "
                                              r"final_logits_bias after its output projection, so its logits are "
                                              r"not hidden @ head$"):
            call()
    # hidden size = vocabulary: the bias was added to the hidden states without a shape error, other items came out
    square = bart_model(d_model=VOCAB)
    with torch.no_grad():
        square.final_logits_bias.normal_()
    with pytest.raises(ZeroGRError, match=r"^model: BartForConditionalGeneration adds a non-zero final_logits_bias"):
        generate(square, ids, index, beam_width=4, token_offsets=OFFSETS, attention_mask=mask)
    model.final_logits_bias = torch.zeros(1, VOCAB + 4)
    with pytest.raises(ZeroGRError, match=r"^model: BartForConditionalGeneration's final_logits_bias has shape "
                                          r"\(1, 24\) for 20 logits$"):
        output_head(model)
