"""The cross-check's hidden states and comparison: position-keyed replay cascades a
reordered tie into different beams; content-keyed replay keeps the beams, and the set
comparison tells an exact tie at the cut from a real difference."""
import numpy as np
import pytest
import torch

from zerogr_core import Catalog, Decoder, build_index
from zerogr_core.bench.checks import CONTRACT_TOLERANCE, compare_sets
from zerogr_core.bench.methods import ReplayModel
from zerogr_core.bench.replay import ContentReplayModel, StepTrace, prefix_score
from zerogr_core.decode.heads import Heads

SIZES = (4, 6, 6)
H, BATCH = 8, 4


def tiny_index():
    rng = np.random.default_rng(3)
    sids = np.unique(np.stack([rng.integers(0, s, 80) for s in SIZES], 1), axis=0)
    return build_index(Catalog.from_sids(sids, SIZES), device="cpu")


def heads_with_tie(scale_last: float, coefs=(3, 2, 1, 1)):
    """Level-0 rows are multiples ``coefs`` of e_0: with a positive first hidden component
    the last two tokens tie exactly; ``scale_last`` rescales token 3 in the copy that
    plays the other decoder."""
    g = torch.Generator().manual_seed(5)
    e0 = torch.zeros(H)
    e0[0] = 1.0
    first = torch.stack([c * e0 for c in coefs])
    rest = [torch.randn(s, H, generator=g) / H ** 0.5 for s in SIZES[1:]]
    other = first.clone()
    other[3] *= scale_last
    return [first] + rest, [other] + rest


def content_model():
    m = ContentReplayModel.draw(len(SIZES), 257, H, torch.float32, "cpu", BATCH, seed=1)
    m.tables[0][:, 0] = m.tables[0][:, 0].abs() + 1  # every request prefers tokens 0 > 1 > 2 = 3
    return m


def position_model(beam):
    g = torch.Generator().manual_seed(9)
    sets = [[2 * torch.randn(BATCH, 1 if l == 0 else beam, H, generator=g) for l in range(len(SIZES))]]
    sets[0][0][..., 0] = sets[0][0][..., 0].abs() + 1
    return ReplayModel(sets, BATCH)


def decode(index, heads, model, beam):
    trace = StepTrace(model)
    r = Decoder(index, heads, beam, engine="reference", projection="selective").decode(trace, BATCH)
    return (r.tokens, r.scores, r.item_rows), trace.kept(r.tokens, index.n_levels)


def check(index, ref_heads, got_heads, model, beam):
    ref, ref_kept = decode(index, ref_heads, model, beam)
    got, got_kept = decode(index, got_heads, model, beam)
    hs = Heads.build(ref_heads, SIZES)
    score_of = lambda b, p: prefix_score(index, hs, model, b, p)  # noqa: E731
    return compare_sets(got, ref, got_kept, ref_kept, score_of, CONTRACT_TOLERANCE), got, ref


def test_a_reordered_tie_cascades_under_position_keyed_replay_only():
    # beam 4 keeps every first token; the other decoder orders the two best, tied, tokens
    # the other way round (its token 3 is larger by one part in 10^6)
    index = tiny_index()
    ref_heads, got_heads = heads_with_tie(1 + 1e-6, coefs=(0.5, 0.2, 2, 2))
    (ref, _), (got, _) = (decode(index, h, position_model(4), 4) for h in (ref_heads, got_heads))
    first_order = [got[0][b, :, 0].tolist() != ref[0][b, :, 0].tolist() for b in range(BATCH)]
    sets_differ = [{tuple(t) for t in got[0][b].tolist()} != {tuple(t) for t in ref[0][b].tolist()}
                   for b in range(BATCH)]
    assert any(sets_differ), "position-keyed replay should hand the swapped beams each other's hidden states"
    assert any(first_order)

    c, got, ref = check(index, ref_heads, got_heads, content_model(), 4)
    assert c["passed"] and c["status"] in ("equal", "equal-as-sets"), c
    assert c["mismatched_beams"] == 0 and c["max_score_diff"] < 1e-5, c


def test_a_tie_at_the_cut_passes_and_a_real_difference_fails():
    # beam 3 cuts between the tied tokens 2 and 3 (and 1): the decoders keep different ones
    index = tiny_index()
    model = content_model()
    coefs = (1.1, 1, 1, 1)
    c, got, ref = check(index, *heads_with_tie(1 + 1e-6, coefs), model, 3)
    assert c["status"] == "equal-up-to-ties" and c["passed"], c
    assert c["n_tie_requests"] == BATCH and all(t["step"] == 1 for t in c["tie_requests"]), c
    assert c["max_tie_spread"] < 1e-5
    # token 3 clearly larger: the same swap is no tie
    c, _, _ = check(index, *heads_with_tie(1.5, coefs), model, 3)
    assert not c["passed"] and c["status"] == "different" and c["failure"], c


def test_content_keyed_states_are_a_function_of_request_and_prefix():
    m = content_model()
    pre = torch.tensor([[[1, 2], [3, 0], [1, 2]], [[1, 2], [3, 0], [-1, -1]]])
    h = m(2, pre)
    assert h.shape == (2, 3, H)
    assert torch.equal(h[0, 0], h[0, 2]) and not torch.equal(h[0, 0], h[1, 0])
    assert torch.equal(m.hidden_of(1, (3, 0)), h[1, 1]) and torch.equal(m.hidden_of(0, (1, 2)), h[0, 0])
    # one request's state does not depend on the batch it is decoded in, nor on its slot
    assert torch.equal(m(2, pre[:1, [2, 1, 0]])[0, 0], h[0, 2])
    if torch.cuda.is_available():
        mc = ContentReplayModel([t.cuda() for t in m.tables], BATCH)
        assert torch.equal(mc.keys(2, pre.cuda()).cpu(), m.keys(2, pre))


def test_prefix_score_matches_the_reference_decode():
    index = tiny_index()
    heads, _ = heads_with_tie(1.0, (1.1, 1, 1, 1))
    model = content_model()
    (tokens, scores, _), _ = decode(index, heads, model, 5)
    hs = Heads.build(heads, SIZES)
    for b in range(BATCH):
        for m in range(5):
            if scores[b, m] > float("-inf"):
                assert prefix_score(index, hs, model, b, tokens[b, m].tolist()) == pytest.approx(
                    float(scores[b, m]), abs=1e-5)
    assert np.isnan(prefix_score(index, hs, model, 0, [0, 99, 0]))


@pytest.mark.parametrize("other, passed", [(-1.0 + 1e-6, True), (-1.5, False)])
def test_compare_sets_scores_the_beams_that_differ(other, passed):
    ref = (torch.tensor([[[0], [1]]]), torch.tensor([[-0.5, -1.0]]))
    got = (torch.tensor([[[0], [2]]]), torch.tensor([[-0.5, other]]))
    scores = {(1,): -1.0, (2,): other}
    c = compare_sets(got, ref, [got[0]], [ref[0]], lambda b, p: scores[tuple(p)], 1.0)
    assert c["passed"] is passed and c["mismatched_beams"] == 1
    assert c["status"] == ("equal-up-to-ties" if passed else "different")
    assert passed or "request 0 step 1" in c["failure"]
