"""One numeric contract: every plan option returns the same beams, in every dtype.

Logits are accumulated and kept in float32 whatever the head's dtype, log-softmax and
scores are float32, and ties are broken the same way by every top-k path (higher score
first, then the lower flat candidate index). So the GPU engine under any per-step plan,
the reference path under either projection, and the CPU plan's choice all return
identical tokens and items, with scores within 1e-5. Runs through the Triton interpreter
on a CPU and compiled on a GPU.
"""
import numpy as np
import pytest
import torch

from zerogr_core import Catalog, Decoder, build_index
from zerogr_core.decode.engine import GpuEngine
from zerogr_core.decode.options import step_options
from zerogr_core.decode.heads import Heads
from zerogr_core.decode.ops import REFERENCE
from zerogr_core.decode.reference_plan import (default_projection, make_reference_plan, plan_projection, projection_of,
                                              reference_options)
from zerogr_kernels import TOPK_PATHS

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SIZES = (8, 24, 24)
BEAM, BATCH, HIDDEN = 5, 2, 16
SCORE_ATOL = 1e-5


def catalog_index(device=DEV):
    # level 1 is dense, levels 2 and 3 sparse
    rng = np.random.default_rng(7)
    sids = np.unique(np.stack([rng.integers(0, s, 90) for s in SIZES], 1), axis=0)
    index = build_index(Catalog.from_sids(sids, SIZES), device=device)
    assert {s.kind for s in index.steps} == {"dense", "sparse"}
    return index


def model(kind: str, dtype: torch.dtype, device=DEV):
    """(per-level heads, hidden_fn). ``random``: Gaussian. ``ties``: each level's head rows
    drawn from 2 distinct quantised rows (many logits tie exactly inside a beam's row) and
    quantised hidden states, so every product and sum is exact in float32 and ties stay
    exact ties under any accumulation order."""
    g = torch.Generator().manual_seed(11)
    n_table = 4096
    if kind == "random":
        heads = [torch.randn(s, HIDDEN, generator=g) for s in SIZES]
        table = 0.3 * torch.randn(n_table, HIDDEN, generator=g)
    else:
        pools = [torch.randint(-8, 9, (2, HIDDEN), generator=g) / 8 for _ in SIZES]
        heads = [p[torch.randint(0, 2, (s,), generator=g)] for p, s in zip(pools, SIZES)]
        table = torch.randint(-8, 9, (n_table, HIDDEN), generator=g) / 16
    heads = [w.to(dtype).to(device) for w in heads]
    table = table.to(dtype).to(device)
    mix = torch.tensor([1000003, 8191, 131071, 524287], device=device)

    def hidden_fn(step, prefixes):
        # a hash of (request, prefix content, step): distinct prefixes see distinct states
        b, m, l = prefixes.shape
        req = torch.arange(b, device=device)[:, None].expand(b, m)
        key = req * 7919 + step * 104729
        if l:
            key = key + ((prefixes + 2) * mix[:l]).sum(-1)
        return table[(key * 2654435761) % 4093]

    return heads, hidden_fn


def option_plans(index):
    """Plans in which every option of ``step_options`` (every mode x every top-k path
    that fits) is forced at every step at least once: plan ``j`` takes option ``j``
    (cycling) at each step."""
    per_step = [step_options(m, 1 if l == 0 else BEAM, BEAM, TOPK_PATHS, BATCH, planned=False)
                for l, m in enumerate(index.steps)]
    assert any(o.mode == "dense+full" for o in per_step[0])
    assert all(any(o.mode == "sparse+shared" for o in opts) for opts in per_step)
    assert all(any(o.topk == "prune" for o in opts) for opts in per_step[1:])
    return [[opts[j % len(opts)] for opts in per_step] for j in range(max(map(len, per_step)))], per_step


def assert_same(got, ref, label):
    rows = torch.nonzero((got.tokens != ref.tokens).any(-1))
    assert rows.numel() == 0, (f"{label}: tokens differ at (request, beam) {rows[:4].tolist()}: "
                               f"{got.tokens[tuple(rows[0])].tolist()} vs {ref.tokens[tuple(rows[0])].tolist()}")
    assert torch.equal(got.item_rows, ref.item_rows), f"{label}: item rows differ"
    fin = torch.isfinite(ref.scores)
    assert torch.equal(fin, torch.isfinite(got.scores)), f"{label}: padding differs"
    diff = (got.scores[fin] - ref.scores[fin]).abs().max().item() if fin.any() else 0.0
    assert diff <= SCORE_ATOL, f"{label}: scores differ by {diff:.3g} > {SCORE_ATOL}"
    assert got.scores.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_every_plan_option_gives_the_reference_beams(dtype, kind):
    index = catalog_index()
    heads, hidden_fn = model(kind, dtype)
    ref = Decoder(index, heads, BEAM, engine="reference", projection="selective").decode(hidden_fn, BATCH)
    if kind == "ties":  # the inputs really tie: equal scores inside a request's beams
        s = ref.scores[torch.isfinite(ref.scores)]
        assert s.unique().numel() < s.numel()
    assert torch.isfinite(ref.scores).all()
    for proj in ("full", ("full", "selective", "full")):
        got = Decoder(index, heads, BEAM, engine="reference", projection=proj).decode(hidden_fn, BATCH)
        assert_same(got, ref, f"reference projection {proj}")
    plans, per_step = option_plans(index)
    h = Heads.build(heads, index.codebook_sizes)
    seen = [set() for _ in per_step]
    for plan in plans:
        got = GpuEngine(index, h, BEAM, plan_override=plan, use_graph=False).decode(hidden_fn, BATCH)
        assert_same(got, ref, "plan " + ", ".join(o.label for o in plan))
        for level, option in enumerate(plan):
            seen[level].add(option)
    assert all(s == set(o) for s, o in zip(seen, per_step))


def test_the_cpu_plan_chooses_among_equal_options():
    index = catalog_index("cpu")
    heads, hidden_fn = model("ties", torch.float32, "cpu")
    h = Heads.build(heads, index.codebook_sizes)
    plan = make_reference_plan(index, h, BEAM, hidden_fn, BATCH, ops=REFERENCE, rounds=2)
    for level, choice in enumerate(plan.steps):
        labels = {o.label for o in reference_options(index, level)}
        assert set(choice.times_us) == labels and choice.option.label in labels
        # the fastest, or the reference default kept because the other is not faster beyond noise
        assert (choice.times_us[choice.option.label] == min(choice.times_us.values())
                or projection_of(choice.option) == default_projection(index)[level])
    ref = Decoder(index, heads, BEAM, engine="reference").decode(hidden_fn, BATCH)
    got = Decoder(index, heads, BEAM, engine="reference", projection=plan_projection(plan)).decode(hidden_fn, BATCH)
    assert_same(got, ref, "CPU plan")


def test_the_cpu_decoder_plans_once_per_shape_and_follows_its_plan(monkeypatch):
    import zerogr_core.decode.decoder as decoder_mod

    index = catalog_index("cpu")
    heads, hidden_fn = model("random", torch.float32, "cpu")
    calls = []
    real = decoder_mod.make_reference_plan

    def counted(*args, **kwargs):
        plan = real(*args, **kwargs, rounds=2)
        # force a mixed plan: what the decoder runs must follow it
        steps = tuple(type(s)(s.step, reference_options(index, s.step)[s.step % 2], s.times_us) for s in plan.steps)
        calls.append(steps)
        return type(plan)(plan.key, steps, plan.device)

    monkeypatch.setattr(decoder_mod, "interpreting", lambda: False)
    monkeypatch.setattr(decoder_mod, "make_reference_plan", counted)
    used = []
    real_ff = decoder_mod.FilterFirst

    def recording_ff(index_, heads_, projection, *a, **k):
        used.append(tuple(projection))
        return real_ff(index_, heads_, projection, *a, **k)

    monkeypatch.setattr(decoder_mod, "FilterFirst", recording_ff)
    ref = Decoder(index, heads, BEAM, engine="reference").decode(hidden_fn, BATCH)
    dec = Decoder(index, heads, BEAM)
    used.clear()
    for _ in range(2):
        assert_same(dec.decode(hidden_fn, BATCH), ref, "CPU decoder")
    assert len(calls) == 1 and used == [("full", "selective", "full")] * 2
    assert dec.plan(hidden_fn, BATCH).steps == calls[0]
    dec.decode(hidden_fn, 1)  # a new shape gets its own plan
    assert len(calls) == 2 and set(dec.plans) == {dec.heads.shape_key(b, BEAM) for b in (1, BATCH)}
    fixed = Decoder(index, heads, BEAM, projection="selective")
    assert not fixed.plan_reference and fixed.plan(hidden_fn, BATCH) is None


def test_the_cpu_plan_times_both_projections_in_turns_and_keeps_the_least():
    import time

    from zerogr_core.timing import fastest_us

    calls = []
    slow_once = iter([0.0, 0.02])  # the first timed call of full is disturbed by other work

    def full():
        calls.append("full")
        time.sleep(next(slow_once, 0.0))

    def selective():
        calls.append("selective")
        time.sleep(0.002)

    times = fastest_us({"full": full, "selective": selective}, "cpu", rounds=3)
    assert calls == ["full", "selective", "full", "selective", "selective", "full", "full", "selective"]
    assert times["full"] < times["selective"] and times["selective"] >= 2000


def test_paired_runs_take_turns_call_by_call_and_time_every_call():
    """Two functions alternate, each round starting with the next one, ``before(i)`` runs ahead of
    every call of round ``i``, and only the calls after the warm-up are kept, in milliseconds."""
    import time

    from zerogr_core.timing import paired_runs

    calls = []

    def lists():
        calls.append("lists")
        time.sleep(0.003)

    def none():
        calls.append("none")

    samples = paired_runs({"lists": lists, "none": none}, "cpu", repeats=3, warmup=1,
                          before=lambda i: calls.append(i))
    assert calls == [0, "lists", 0, "none", 1, "none", 1, "lists", 2, "lists", 2, "none", 3, "none", 3, "lists"]
    assert [len(v) for v in samples.values()] == [3, 3]
    assert min(samples["lists"]) >= 3.0 > max(samples["none"])
