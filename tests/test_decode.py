"""Reference decoders against brute-force beam search on small catalogs."""
import math

import numpy as np
import pytest
import torch

from zerogr_core import Catalog, Decoder, ZeroGRError, build_index
from zerogr_core.index import INDEX_PRESETS, HostTrie, build_static_index


class PrefixModel:
    """A hidden_fn whose output depends only on (request, step, prefix tokens)."""

    def __init__(self, sizes, hidden, batch, seed):
        g = torch.Generator().manual_seed(seed)
        self.req = torch.randn(batch, hidden, generator=g, dtype=torch.float64)
        self.tok = [torch.randn(max(sizes) + 1, hidden, generator=g, dtype=torch.float64) for _ in sizes]
        self.step_emb = torch.randn(len(sizes), hidden, generator=g, dtype=torch.float64)

    def hidden(self, request, step, prefix):
        h = self.req[request] + self.step_emb[step]
        for level, t in enumerate(prefix):
            h = h + self.tok[level][t] * (level + 1)
        return torch.tanh(h)

    def __call__(self, step, prefixes):
        b, m, _ = prefixes.shape
        out = torch.empty(b, m, self.req.shape[1], dtype=torch.float64)
        for i in range(b):
            for j in range(m):
                out[i, j] = self.hidden(i, step, [int(t) if t >= 0 else -1 for t in prefixes[i, j]])
        return out.float()


def brute_force(catalog, heads_per_level, model, request, beam, order, normalisers=None):
    """Plain beam search over Python lists, float64."""
    sids = catalog.sids.astype(np.int64)
    beams = [((), 0.0)]
    for step in range(catalog.n_levels):
        cands = []
        for prefix, score in beams:
            rows = sids[np.all(sids[:, :step] == np.array(prefix, dtype=np.int64), axis=1)] if step else sids
            valid = np.unique(rows[:, step])
            h = model.hidden(request, step, list(prefix)).float().double()
            w = heads_per_level[step].double()
            logits = w @ h
            if order == "filter-first":
                lp = torch.log_softmax(logits[valid], 0)
                cands += [(prefix + (int(t),), score + float(v)) for t, v in zip(valid, lp)]
            else:
                wn, off = normalisers[step]
                full = torch.log_softmax(wn.double() @ h, 0)
                cands += [(prefix + (int(t),), score + float(full[off + t])) for t in valid]
        # a NaN candidate (a model output that overflowed) is never kept, as a masked one is not
        cands = sorted((c for c in cands if not math.isnan(c[1])), key=lambda c: -c[1])
        beams = cands[:beam]
    return beams


def random_catalog(rng, sizes, n):
    sids = np.unique(np.stack([rng.integers(0, s, n) for s in sizes], 1), axis=0)
    return Catalog.from_sids(sids, sizes)


def check_against_brute(result, catalog, expected_per_request, beam):
    for r, expected in enumerate(expected_per_request):
        got_scores = result.scores[r].double().numpy()
        for j, (sid, score) in enumerate(expected):
            assert tuple(result.tokens[r, j].tolist()) == sid, f"request {r} beam {j}"
            assert math.isclose(got_scores[j], score, rel_tol=1e-4, abs_tol=1e-4)
            row = int(result.item_rows[r, j])
            assert tuple(catalog.sids[row].tolist()) == sid
        for j in range(len(expected), beam):  # padded beams
            assert result.scores[r, j] == float("-inf") and int(result.item_rows[r, j]) == -1
            assert (result.tokens[r, j] == -1).all()


@pytest.mark.parametrize("sizes,n,beam,batch,projection,preset", [
    ((5, 7, 3), 60, 4, 2, "selective", "default"),
    ((5, 7, 3), 60, 4, 2, "full", "all-sparse"),
    ((2, 2), 3, 8, 1, "selective", "default"),           # fewer items than beams
    ((9, 4, 6, 3), 150, 1, 3, "full", "default"),          # beam width 1
    ((16,), 10, 5, 2, "selective", "all-sparse"),          # one level
    ((3, 3, 3, 3, 3), 1, 3, 1, "selective", "default"),   # single-item catalog
])
def test_filter_first_equals_brute_force(sizes, n, beam, batch, projection, preset):
    rng = np.random.default_rng(n + beam)
    catalog = random_catalog(rng, sizes, n)
    index = build_index(catalog, config=INDEX_PRESETS[preset])
    hidden = 7
    g = torch.Generator().manual_seed(3)
    heads = [torch.randn(s, hidden, generator=g) for s in sizes]
    model = PrefixModel(sizes, hidden, batch, seed=5)
    result = Decoder(index, heads, beam, projection=projection).decode(model, batch)
    assert result.tokens.shape == (batch, beam, len(sizes))
    expected = [brute_force(catalog, heads, model, r, beam, "filter-first") for r in range(batch)]
    check_against_brute(result, catalog, expected, beam)


class NanAfter(PrefixModel):
    """A :class:`PrefixModel` whose hidden state is NaN after one request's prefix."""

    def __init__(self, *args, request, prefix):
        super().__init__(*args)
        self.poisoned = (request, tuple(prefix))

    def hidden(self, request, step, prefix):
        h = super().hidden(request, step, prefix)
        return h * float("nan") if (request, tuple(prefix)) == self.poisoned else h


@pytest.mark.reference_kernels  # the CPU path; the Triton kernels take no NaN (kernels/selection.py)
@pytest.mark.parametrize("order", ["filter-first", "score-first"])
def test_a_beam_with_nan_hidden_states_is_dropped_not_its_requests_others(order):
    # torch's sort ranks NaN first: the poisoned beam's candidates used to take every place of
    # its request, which came back empty (score-first) though its other beams were finite
    rng = np.random.default_rng(5)
    sizes, hidden, batch, beam = (5, 6, 4), 7, 2, 4
    catalog = random_catalog(rng, sizes, 80)
    g = torch.Generator().manual_seed(2)
    heads = [torch.randn(s, hidden, generator=g) for s in sizes]
    normalisers = [(w, 0) for w in heads]
    clean = brute_force(catalog, heads, PrefixModel(sizes, hidden, batch, 6), 0, beam, order, normalisers)
    model = NanAfter(sizes, hidden, batch, 6, request=0, prefix=clean[0][0][:1])
    expected = [brute_force(catalog, heads, model, r, beam, order, normalisers) for r in range(batch)]
    assert len(expected[0]) == beam and expected[0] != clean
    result = Decoder(build_index(catalog), heads, beam, order=order).decode(model, batch)
    check_against_brute(result, catalog, expected, beam)


@pytest.mark.parametrize("shared", [False, True])
def test_score_first_equals_brute_force_over_every_index(shared):
    rng = np.random.default_rng(11)
    sizes = (6, 5, 4)
    catalog = random_catalog(rng, sizes, 70)
    index = build_index(catalog)
    hidden, batch, beam = 9, 2, 5
    g = torch.Generator().manual_seed(4)
    if shared:
        head = torch.randn(sum(sizes) + 3, hidden, generator=g)  # 3 rows outside every band
        offsets = (0, 6, 11)
        per_level = [head[o:o + s] for o, s in zip(offsets, sizes)]
        normalisers = [(head, o) for o in offsets]
        heads_arg = head
    else:
        per_level = [torch.randn(s, hidden, generator=g) for s in sizes]
        normalisers = [(w, 0) for w in per_level]
        heads_arg, offsets = per_level, None
    model = PrefixModel(sizes, hidden, batch, seed=9)
    expected = [brute_force(catalog, per_level, model, r, beam, "score-first", normalisers) for r in range(batch)]
    sources = [None, build_static_index(catalog, band_offsets=offsets), HostTrie.from_catalog(catalog)]
    for source in sources:
        result = Decoder(index, heads_arg, beam, "score-first", band_offsets=offsets, source=source).decode(model, batch)
        check_against_brute(result, catalog, expected, beam)


def test_score_first_refuses_a_source_of_another_catalog():
    """A source built from another catalog (a stale version) decoded silently: its final states were
    read as this catalog's rows, so the beams named items the model never chose."""
    catalog = Catalog.from_sids(np.array([[0, 1, 2], [0, 1, 3], [0, 2, 0], [1, 0, 0], [3, 3, 1], [3, 3, 2]]), [4, 4, 4])
    index = build_index(catalog)
    heads = [torch.randn(4, 8) for _ in range(3)]
    older = Catalog.from_sids(catalog.sids[:3], [4, 4, 4])
    for source in (build_index(older), HostTrie.from_catalog(older), build_static_index(older),
                   build_static_index(older, dense_levels=1)):
        with pytest.raises(ZeroGRError, match=rf"^source: {type(source).__name__} of 3 items in 3 levels, but the "
                                              rf"index holds 6 items in 3"):
            Decoder(index, heads, 4, "score-first", source=source)
    with pytest.raises(ZeroGRError, match=r"^source: built for codebooks \[4, 4, 5\], the index has \[4, 4, 4\]"):
        Decoder(index, heads, 4, "score-first", source=build_index(Catalog.from_sids(catalog.sids, [4, 4, 5])))
    with pytest.raises(ZeroGRError, match=r"^source: score-first needs a StepIndex, StaticIndex or HostTrie, got str"):
        Decoder(index, heads, 4, "score-first", source="trie")
    two = Catalog.from_sids(np.array([[0, 1], [1, 0], [1, 1]]), [2, 2])
    for source in (HostTrie.from_catalog(catalog), build_static_index(catalog),
                   build_static_index(catalog, dense_levels=1)):
        assert Decoder(index, heads, 4, "score-first", source=source).decode(PrefixModel([4] * 3, 8, 1, 0), 1) \
            .item_rows.shape == (1, 4)
    heads2 = [torch.randn(2, 8) for _ in range(2)]
    assert Decoder(build_index(two), heads2, 3, "score-first", source=build_static_index(two)) \
        .decode(lambda s, p: torch.randn(p.shape[0], p.shape[1], 8), 1).item_rows.shape == (1, 3)


def test_unconstrained_marks_non_items():
    rng = np.random.default_rng(2)
    sizes = (4, 4, 4)
    catalog = random_catalog(rng, sizes, 8)
    index = build_index(catalog)
    heads = [torch.randn(s, 5) for s in sizes]
    model = PrefixModel(sizes, 5, 2, seed=1)
    result = Decoder(index, heads, 16, "unconstrained").decode(model, 2)
    table = {tuple(r) for r in catalog.sids.tolist()}
    for r in range(2):
        for j in range(16):
            sid = tuple(result.tokens[r, j].tolist())
            row = int(result.item_rows[r, j])
            if sid in table:
                assert tuple(catalog.sids[row].tolist()) == sid
            else:
                assert row == -1
    assert (result.item_rows == -1).any()  # 16 beams over 64 sequences, 8 items


def test_every_output_is_an_item_or_padding():
    rng = np.random.default_rng(8)
    sizes = (8, 8, 8, 8)
    catalog = random_catalog(rng, sizes, 200)
    index = build_index(catalog)
    heads = [torch.randn(s, 16) for s in sizes]
    hidden = lambda step, prefixes: torch.randn(prefixes.shape[0], prefixes.shape[1], 16)  # noqa: E731
    table = {tuple(r) for r in catalog.sids.tolist()}
    for order in ("filter-first", "score-first"):
        result = Decoder(index, heads, 32, order).decode(hidden, 3)
        for r in range(3):
            for j in range(32):
                row = int(result.item_rows[r, j])
                if row < 0:
                    assert result.scores[r, j] == float("-inf")
                else:
                    assert tuple(result.tokens[r, j].tolist()) in table
                    assert tuple(catalog.sids[row].tolist()) == tuple(result.tokens[r, j].tolist())


def test_bad_arguments():
    catalog = Catalog.from_sids(np.array([[0, 1], [1, 0]]), [2, 2])
    index = build_index(catalog)
    heads = [torch.randn(2, 4), torch.randn(2, 4)]
    with pytest.raises(ZeroGRError, match="order"):
        Decoder(index, heads, 2, order="sideways")
    with pytest.raises(ZeroGRError, match="beam_width"):
        Decoder(index, heads, 0)
    with pytest.raises(ZeroGRError, match=r"heads\[1\]"):
        Decoder(index, [torch.randn(2, 4), torch.randn(3, 4)], 2)
    with pytest.raises(ZeroGRError, match="hidden_fn"):
        Decoder(index, heads, 2).decode(lambda s, p: torch.zeros(1, 1, 5), 1)
    with pytest.raises(ZeroGRError, match="beam_width must be a positive integer, got True"):
        Decoder(index, heads, True)
    model = PrefixModel([2, 2], 4, 2, 0)
    dec = Decoder(index, heads, np.int64(2))  # numpy's integers are integers
    for bad in (1.5, "2", None, True, 0, -1, torch.tensor(2.0)):
        with pytest.raises(ZeroGRError, match="batch_size must be a positive integer"):
            dec.decode(model, bad)
    for fine in (np.int64(2), torch.tensor(2)):
        assert dec.decode(model, fine).item_rows.shape == (2, 2)


def test_arguments_of_the_wrong_kind_are_named():
    """A Catalog passed as the index, a SID array as catalog=, heads=None or a model that is not callable
    raised AttributeError/TypeError from inside the decoder; a StepIndex as catalog= was accepted, and the
    first list failed on it later."""
    catalog = Catalog.from_sids(np.array([[0, 1], [1, 0]]), [2, 2])
    index = build_index(catalog)
    heads = [torch.randn(2, 4), torch.randn(2, 4)]
    with pytest.raises(ZeroGRError, match=r"^index: expected a StepIndex \(build_index\(catalog\)\), got Catalog$"):
        Decoder(catalog, heads, 2)
    for bad in (index, catalog.sids):
        with pytest.raises(ZeroGRError, match=r"^catalog: expected the Catalog the index was built from, got "):
            Decoder(index, heads, 2, catalog=bad)
    with pytest.raises(ZeroGRError, match=r"^heads: expected one \(\|V_l\|, H\) tensor per level or one shared "
                                          r"\(rows, H\) tensor, got NoneType$"):
        Decoder(index, None, 2)
    with pytest.raises(ZeroGRError, match=r"^model: expected a hidden_fn\(step, prefixes\) or a prefilled step "
                                          r"model, got int$"):
        Decoder(index, heads, 2).decode(5, 1)
    # as many items, other codebooks (another version of the catalog): its ids would name other rows
    other = Catalog.from_sids(np.array([[0, 2], [1, 0]]), [2, 3])
    with pytest.raises(ZeroGRError, match=r"^catalog has codebooks 2/3 but the index 2/2: build both from one"):
        Decoder(index, heads, 2, catalog=other)


def test_heads_the_projections_cannot_read_are_named():
    """float64 heads (torch.from_numpy) failed deep in a kernel, naming the hidden states; levels of
    different dtypes or devices failed later, or only on the GPU engine."""
    catalog = Catalog.from_sids(np.array([[0, 1], [1, 0]]), [2, 2])
    index = build_index(catalog)
    with pytest.raises(ZeroGRError, match=r"^heads\[0\]: dtype float64; heads must be float16, bfloat16 or float32"):
        Decoder(index, [torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)], 2)
    with pytest.raises(ZeroGRError, match=r"^heads: dtype int64"):
        Decoder(index, torch.ones(4, 4, dtype=torch.int64), 2)
    with pytest.raises(ZeroGRError, match=r"^heads\[1\]: float16 on cpu, but heads\[0\] is float32 on cpu"):
        Decoder(index, [torch.randn(2, 4), torch.randn(2, 4).half()], 2)
    with pytest.raises(ZeroGRError, match=r"^heads\[1\]: float32 on meta, but heads\[0\] is float32 on cpu"):
        Decoder(index, [torch.randn(2, 4), torch.randn(2, 4, device="meta")], 2)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        heads = [torch.randn(2, 4).to(dtype) for _ in range(2)]
        assert Decoder(index, heads, 2).decode(PrefixModel([2, 2], 4, 1, 0), 1).item_rows.shape == (1, 2)


def test_band_offsets_that_cannot_apply_are_refused():
    """Offsets given with per-level heads were silently dropped, and 10.5 became row 10 of the shared head."""
    catalog = Catalog.from_sids(np.array([[0, 1], [1, 0]]), [2, 2])
    index = build_index(catalog)
    per_level = [torch.randn(2, 4), torch.randn(2, 4)]
    with pytest.raises(ZeroGRError, match=r"^band_offsets: apply only to one shared \(rows, H\) head"):
        Decoder(index, per_level, 2, band_offsets=[0, 2])
    shared = torch.randn(6, 4)
    for bad, shown in (([0, 2.5], "2.5"), ([0, True], "True"), ([0, "2"], "'2'"), ([0, float("nan")], "nan")):
        with pytest.raises(ZeroGRError, match=rf"^band_offsets: level 2 offset {shown} is not a whole number$"):
            Decoder(index, shared, 2, band_offsets=bad)
    with pytest.raises(ZeroGRError, match=r"^band_offsets: expected one whole number per level, got int$"):
        Decoder(index, shared, 2, band_offsets=2)
    # whole numbers of any type still apply
    for good in ([0, 4], (np.int64(0), np.int64(4)), [0.0, 4.0], torch.tensor([0, 4])):
        assert Decoder(index, shared, 2, band_offsets=good).heads.band_offsets == (0, 4)
