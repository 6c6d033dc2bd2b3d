"""The decoder-only recommender's capturable prefill (``stage``: the history pass at step 0)
against the prefill outside the decode and the reference that recomputes every sequence,
run eagerly on the CPU."""
import numpy as np
import pytest
import torch

from zerogr_core import Catalog, Decoder, build_index
from zerogr_core.errors import ZeroGRError
from zerogr_core.models.decoder_only import DecoderOnlyConfig, DecoderOnlyRecommender
from zerogr_core.models.protocol import StepDecoder

SIZES = (6, 7, 5, 4)
BEAM = 8


def model(dtype=torch.float32, device=None):
    torch.manual_seed(0)
    with torch.device(device or "cpu"):
        return DecoderOnlyRecommender(DecoderOnlyConfig.preset("tiny", SIZES)).eval().to(dtype)


def catalog():
    rng = np.random.default_rng(0)
    sids = np.unique(np.stack([rng.integers(0, v, 400) for v in SIZES], axis=1), axis=0)
    return Catalog.from_sids(sids, SIZES)


def histories(batch, t, seed):
    """Left-padded SID histories of ``t`` positions, every request of another length (one
    full, one a single item); the padding holds junk SIDs, which must not matter."""
    gen = torch.Generator().manual_seed(seed)
    history = torch.stack([torch.randint(0, v, (batch, t), generator=gen) for v in SIZES], dim=2)
    lengths = torch.randint(1, t + 1, (batch,), generator=gen)
    lengths[0], lengths[-1] = t, 1
    mask = torch.arange(t)[None, :] >= t - lengths[:, None]
    return history, mask.long()


def reference(m, index, history, mask):
    """Beams of the reference decoder over every sequence recomputed from its prefixes."""
    decoder = Decoder(index, m.head_weight(), BEAM, band_offsets=m.band_offsets, engine="reference")
    return decoder.decode(lambda step, prefixes: m.recompute_hidden(history, mask, prefixes), history.shape[0])


def assert_same_beams(got, want, tol=1e-5):
    assert torch.equal(got.item_rows, want.item_rows)
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.scores, want.scores, rtol=tol, atol=tol)


def test_staged_decode_gives_the_beams_of_the_prefill_outside_and_the_reference():
    """Histories of different lengths in one batch, across two buckets: staged, outside and
    recomputed decodes agree; requests of one bucket reuse the static buffers."""
    m, index = model(), build_index(catalog())
    outside = StepDecoder(m.step_model(), index, m.head_weight(), beam_width=BEAM, band_offsets=m.band_offsets,
                          prefill="outside")
    inside = StepDecoder(m.step_model(history_bucket=6), index, m.head_weight(), beam_width=BEAM,
                         band_offsets=m.band_offsets, prefill="inside")
    assert inside.stage and not outside.stage
    sm = inside.step_model
    buffers = None
    for seed, t in ((0, 11), (1, 9), (2, 12), (3, 5), (4, 3)):   # buckets 12, 12, 12, 6, 6
        history, mask = histories(4, t, seed)
        got, want = inside.decode(history, mask), outside.decode(history, mask)
        assert_same_beams(got, want)
        assert_same_beams(got, reference(m, index, history, mask), tol=1e-4)
        assert (got.item_rows >= 0).all()
        assert sm.history_in_step and sm._static_key[1] == sm.bucket(t) == (12 if t > 6 else 6)
        assert sm.ids.shape == (4, sm.bucket(t), len(SIZES)) and sm.history_kv[0][0].shape[2] == sm.bucket(t)
        if t in (9, 12):
            assert sm.ids is buffers[0] and sm.history_kv[0][0] is buffers[1]
        elif t == 3:
            assert sm.ids is buffers[0]
        else:
            assert buffers is None or sm.ids is not buffers[0]
        buffers = (sm.ids, sm.history_kv[0][0])


def test_a_padded_request_gets_the_beams_it_gets_alone():
    m, index = model(), build_index(catalog())
    serving = StepDecoder(m.step_model(history_bucket=4), index, m.head_weight(), beam_width=BEAM,
                          band_offsets=m.band_offsets, prefill="inside")
    history, mask = histories(3, 10, seed=5)
    both = serving.decode(history, mask)
    n = int(mask[1].sum())
    alone = serving.decode(history[1:2, -n:], None)
    assert torch.equal(both.item_rows[1:2], alone.item_rows)
    torch.testing.assert_close(both.scores[1:2], alone.scores, rtol=1e-5, atol=1e-5)


def test_switching_between_the_two_prefills():
    """One step model served both ways in turn gives the same beams each time."""
    m, index = model(), build_index(catalog())
    step_model = m.step_model()
    a = StepDecoder(step_model, index, m.head_weight(), beam_width=BEAM, band_offsets=m.band_offsets,
                    prefill="inside")
    b = StepDecoder(step_model, index, m.head_weight(), beam_width=BEAM, band_offsets=m.band_offsets,
                    prefill="outside")
    history, mask = histories(2, 7, seed=6)
    first = a.decode(history, mask)
    second = b.decode(history, mask)
    assert not step_model.history_in_step
    third = a.decode(history, mask)
    assert step_model.history_in_step
    assert_same_beams(second, first)
    assert_same_beams(third, first, tol=0)


def test_staged_loop_serving_equals_prefill_outside():
    """The bench's loop methods stage the decoder-only model the same way and decode the same beams."""
    from zerogr_core.bench.e2e import LoopServing
    from zerogr_core.bench.methods import UnconstrainedStep
    from zerogr_core.decode.heads import Heads

    m = model()
    heads = Heads.build(m.head_weight(), SIZES, m.band_offsets)
    history, mask = histories(3, 9, seed=7)
    out = []
    for stage in (False, True):
        serving = LoopServing(m.step_model(), lambda b: UnconstrainedStep(heads, b, BEAM), len(SIZES), BEAM,
                              heads.hidden_size, heads.dtype, torch.device("cpu"), stage=stage)
        out.append(serving.decode(history, mask))
        assert serving.step_model.history_in_step == stage
    assert torch.equal(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-5, atol=1e-5)


def test_stage_checks_its_inputs_before_copying():
    m = model()
    step_model = m.step_model(history_bucket=6)
    assert [step_model.bucket(t) for t in (1, 6, 7, 13, 16)] == [6, 6, 12, 16, 16]   # at most max_history (16)
    history = torch.zeros(2, 3, len(SIZES), dtype=torch.int64)
    with pytest.raises(ZeroGRError, match="padding on the left"):
        step_model.stage(history, torch.tensor([[1, 1, 0], [1, 1, 1]]), beam_width=2)
    with pytest.raises(ZeroGRError, match="every row needs ≥ 1 item"):
        step_model.stage(history, torch.tensor([[0, 0, 0], [1, 1, 1]]), beam_width=2)
    with pytest.raises(ZeroGRError, match="exceed max_history"):
        step_model.stage(torch.zeros(2, 17, len(SIZES), dtype=torch.int64), None, beam_width=2)
    with pytest.raises(ZeroGRError, match="attention_mask: shape"):
        step_model.stage(history, torch.ones(2, 4), beam_width=2)
    assert not step_model.batch                                    # nothing was staged
    with pytest.raises(ZeroGRError, match="history_bucket"):
        m.step_model(history_bucket=0)


@pytest.mark.parametrize("prefill", ["inside", "outside"])
def test_history_tokens_outside_their_codebook_are_refused(prefill):
    """A token past its level's codebook embedded as the next level's token (a wrong answer, silently),
    or past the table at the last level (an IndexError here, a device-side assert on a GPU); a negative
    one as token 0. Now one line naming the row, item and level; padding may hold anything, and a
    refused call leaves the next decode as it was."""
    m, index = model(), build_index(catalog())
    run = StepDecoder(m.step_model(history_bucket=6), index, m.head_weight(), beam_width=BEAM,
                      band_offsets=m.band_offsets, prefill=prefill)
    history, mask = histories(3, 7, seed=9)
    want = run.decode(history, mask)
    for (row, item, level), value in (((0, 2, 0), SIZES[0]), ((1, 6, 3), SIZES[3] + 5), ((2, 6, 1), -1)):
        bad = history.clone()
        bad[row, item, level] = value
        with pytest.raises(ZeroGRError, match=rf"^history: row {row}, item {item} has token {value} at level "
                                              rf"{level + 1}, outside its codebook \[0, {SIZES[level]}\)$"):
            run.decode(bad, mask)
        with pytest.raises(ZeroGRError, match=rf"^history: row {row}, item {item} has token"):
            run.decode(bad, None)
    padded = history.clone()
    padded[2, 0] = torch.tensor([-1, 99, -7, 4])                  # row 2 holds one item: position 0 is padding
    assert mask[2, 0] == 0
    assert_same_beams(run.decode(padded, mask), want)
    with pytest.raises(ZeroGRError, match=r"^history: SID tokens must be integers, got float32$"):
        run.decode(history.float(), mask)
    assert_same_beams(run.decode(history, mask), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_decode_reads_no_tensor_value_on_the_host(dtype):
    """On the meta device (shapes only, no values) every op that would synchronise with the
    host (``.item()``, ``bool(tensor)``, data-dependent shapes) fails: the staged history
    pass and the steps run there, so they can be captured. ``stage`` checks the requests
    where they are (here on the CPU, before copying); ``prefill`` checks them on the model's
    device, which reads a value."""
    meta = model(dtype, device="meta")
    step_model = meta.step_model()
    history, mask = histories(2, 9, seed=8)
    step_model.stage(history, mask, beam_width=4)
    assert step_model.ids.is_meta and step_model.ids.shape == (2, 16, len(SIZES))
    assert step_model.step(0, None, None).shape == (2, 32)
    tokens = torch.zeros(2, 4, dtype=torch.int32, device="meta")
    parents = torch.zeros(2, 4, dtype=torch.int64, device="meta")
    for level in range(1, len(SIZES)):
        assert step_model.step(level, tokens, parents).shape == (8, 32)
    with pytest.raises(RuntimeError, match="meta"):
        step_model.prefill(history, mask, beam_width=4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_history_tokens_outside_their_codebook_are_refused():
    """On a GPU a last-level token past the table ended the CUDA context in the embedding's device-side
    assert. Now the one-line error, and the captured decode after it returns what it did before."""
    m, index = model(device="cuda"), build_index(catalog(), device="cuda")
    run = StepDecoder(m.step_model(history_bucket=6), index, m.head_weight(), beam_width=BEAM,
                      band_offsets=m.band_offsets, prefill="inside")
    history, mask = (t.cuda() for t in histories(3, 7, seed=9))
    want = [run.decode(history, mask) for _ in range(2)][-1]
    bad = history.clone()
    bad[1, 6, 3] = SIZES[3] + 5
    with pytest.raises(ZeroGRError, match=r"^history: row 1, item 6 has token 9 at level 4, outside its codebook"):
        run.decode(bad, mask)
    padded = history.clone()
    padded[2, 0, 1] = 10**6                                       # padding: embedded clamped, never read
    assert_same_beams(run.decode(padded, mask), want)
    torch.cuda.synchronize()
    assert_same_beams(run.decode(history, mask), want)
