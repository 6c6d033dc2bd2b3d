"""The GPU engine (eager here, graph on CUDA) returns the reference beams under any plan."""
import itertools

import numpy as np
import pytest
import torch

from zerogr_core import Catalog, Decoder, ZeroGRError, build_index
from zerogr_core.index import INDEX_PRESETS
from zerogr_kernels import TOPK_PATHS
from zerogr_core.decode.engine import GpuEngine, StepRunner
from zerogr_core.decode.options import StepOption, step_options
from zerogr_core.decode.heads import Heads
from zerogr_core.decode.planner import DEFAULT_COST_MODEL, make_plan


def setup(seed=0, sizes=(12, 6, 5), n=150, hidden=24, shared=False, dtype=torch.float32):
    rng = np.random.default_rng(seed)
    sids = np.unique(np.stack([rng.integers(0, s, n) for s in sizes], 1), axis=0)
    catalog = Catalog.from_sids(sids, sizes)
    index = build_index(catalog)
    g = torch.Generator().manual_seed(seed)
    if shared:
        heads = torch.randn(sum(sizes) + 2, hidden, generator=g).to(dtype)
    else:
        heads = [torch.randn(s, hidden, generator=g).to(dtype) for s in sizes]
    table = torch.randn(64, hidden, generator=g).to(dtype)

    def hidden_fn(step, prefixes):
        # Depends on the beams' prefixes, so a wrong parent gather changes the result.
        key = (prefixes.clamp(min=0) * 7 + 3).sum(-1) + step * 13
        return table[key % 64]

    return catalog, index, heads, hidden_fn


def assert_same_beams(a, b, atol=1e-4):
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.item_rows, b.item_rows)
    torch.testing.assert_close(a.scores, b.scores, rtol=atol, atol=atol)


@pytest.mark.parametrize("shared", [False, True])
def test_every_plan_matches_reference(shared):
    catalog, index, heads, hidden_fn = setup(shared=shared)
    beam, batch = 6, 2
    ref_sel = Decoder(index, heads, beam, engine="reference").decode(hidden_fn, batch)
    h = Heads.build(heads, index.codebook_sizes)
    # every path, a plan with "prune" at every later step included
    per_step = [step_options(m, 1 if l == 0 else beam, beam, TOPK_PATHS, batch, planned=False)
                for l, m in enumerate(index.steps)]
    assert any(o.topk == "prune" for o in per_step[1]) and any(o.mode == "sparse+shared" for o in per_step[1])
    combos = list(itertools.product(*per_step))
    rng = np.random.default_rng(0)
    picks = list(rng.choice(len(combos), size=min(6, len(combos)), replace=False))
    picks.append(next(i for i, c in enumerate(combos) if all(o.topk == "prune" for o in c[1:])))
    for pick in picks:
        plan = combos[pick]
        out = GpuEngine(index, h, beam, plan_override=list(plan), use_graph=False).decode(hidden_fn, batch)
        assert_same_beams(out, ref_sel)



def test_planner_reports_an_option_that_fails_and_never_picks_it(monkeypatch):
    catalog, index, heads, hidden_fn = setup(seed=3, sizes=(6, 4), n=20, hidden=8)
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), 3, use_graph=False)
    real = StepRunner.select

    def broken_split(self, slots, scores, prefixes=None):
        if self.option.topk == "split":
            raise RuntimeError("split does not compile here")
        return real(self, slots, scores, prefixes)

    monkeypatch.setattr(StepRunner, "select", broken_split)
    plan = make_plan(engine.plan_shape(hidden_fn, 1))
    for choice in plan.steps:
        assert choice.option.topk != "split" and choice.failed
        assert all("split does not compile here" in err for err in choice.failed.values())
    assert all("failed" in row for row in plan.table())

def test_planner_times_every_option_and_caches_per_shape():
    catalog, index, heads, hidden_fn = setup(seed=3, sizes=(6, 4), n=20, hidden=8)
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), 3, use_graph=False)
    shape = engine.plan_shape(hidden_fn, 1)
    plan = make_plan(shape)
    assert len(plan.steps) == 2
    for level, choice in enumerate(plan.steps):
        options = step_options(index.steps[level], 1 if level == 0 else 3, 3)
        labels = {o.label for o in options}
        assert set(choice.times_us) == labels and (level == 0 or any(lab.endswith("prune") for lab in labels))
        # the fastest, or (a CPU's noisy clock) the cost model's pick, kept unless beaten beyond noise
        mapping, n_beams = shape.work[level]
        predicted = {o.label: DEFAULT_COST_MODEL.predict_us(o, mapping, n_beams, shape.hidden_size, shape.dtype)
                     for o in options}
        assert (choice.times_us[choice.option.label] == min(choice.times_us.values())
                or choice.option.label == min(predicted, key=predicted.get))
    rows = plan.table()
    assert rows[0]["step"] == 1 and rows[0]["mode"] in ("dense+full", "sparse+full", "sparse+selective")
    out = engine.decode(hidden_fn, 1)
    assert engine.key(1) in engine.plans
    ref = Decoder(index, heads, 3, engine="reference").decode(hidden_fn, 1)
    assert torch.equal(out.tokens, ref.tokens)


def test_bad_overrides():
    catalog, index, heads, hidden_fn = setup(sizes=(4, 4), n=10, hidden=4)
    h = Heads.build(heads, index.codebook_sizes)
    with pytest.raises(ZeroGRError, match="MODE/TOPK"):
        StepOption.parse("sparse+magic/small")
    with pytest.raises(ZeroGRError, match="plan override"):
        GpuEngine(index, h, 2, plan_override=["full"])
    sparse_index = build_index(catalog, config=INDEX_PRESETS["all-sparse"])
    with pytest.raises(ZeroGRError, match="not available"):
        GpuEngine(sparse_index, h, 2, plan_override=["dense+full/small"] * 2).options_for(1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_graph_replay_matches_eager_and_reference_on_gpu(dtype):
    catalog, index, heads, _ = setup(seed=5, sizes=(300, 40, 30, 20), n=20000, hidden=96, dtype=dtype)
    index = index.to("cuda")
    heads = [w.cuda() for w in heads]
    table = torch.randn(64, 96, device="cuda").to(dtype)

    def hidden_fn(step, prefixes):  # pure GPU work: capturable
        return table[((prefixes.clamp(min=0) * 7 + 3).sum(-1) + step * 13) % 64]

    for batch in (1, 4):
        graph = Decoder(index, heads, 16, engine="graph")
        a = graph.decode(hidden_fn, batch)
        assert graph.gpu_engine.graph_error is None
        plan = graph.gpu_engine.plans[graph.gpu_engine.key(batch)]
        options = [s.option for s in plan.steps]
        eager = Decoder(index, heads, 16, engine="eager", projection=options).decode(hidden_fn, batch)
        assert torch.equal(a.tokens, eager.tokens) and torch.equal(a.scores, eager.scores)
        b = graph.decode(hidden_fn, batch)  # replay
        assert torch.equal(a.tokens, b.tokens)
        # Any plan gives the reference beams (float32 logits in every option and dtype).
        ref = Decoder(index, heads, 16, engine="reference").decode(hidden_fn, batch)
        assert_same_beams(a, ref)


def test_topk_paths_choose_what_the_planner_times():
    catalog, index, heads, hidden_fn = setup(seed=3, sizes=(6, 4), n=20, hidden=8)
    h = Heads.build(heads, index.codebook_sizes)
    plan = make_plan(GpuEngine(index, h, 3, use_graph=False, topk_paths=("prune", "wide")).plan_shape(hidden_fn, 1))
    assert {s.option.topk for s in plan.steps[1:]} <= {"prune", "wide"}
    assert any(label.endswith("prune") for label in plan.steps[1].times_us)
    with pytest.raises(ZeroGRError, match="topk paths"):
        GpuEngine(index, h, 3, topk_paths=("radix",))


def test_a_caller_mistake_during_capture_does_not_make_the_shape_eager_for_good(monkeypatch):
    """A call whose hidden_fn returned the wrong shape, on a shape captured before, was taken for a
    model that cannot be captured: the shape replayed eagerly from then on, for every later caller."""
    catalog, index, heads, hidden_fn = setup(seed=3, sizes=(6, 4), n=20, hidden=8)
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), 3, use_graph=False)
    engine.use_graph = True  # the capture itself is injected: no CUDA needed
    calls = {"capture": 0, "replay": 0}

    class Replay:  # stands in for the captured graph: replays by running the decode eagerly
        def __init__(self, shape, fn):
            self.shape, self.fn, self.outputs = shape, fn, None

        def replay(self):
            calls["replay"] += 1
            tokens, scores, rows = self.shape.run(self.fn)
            for out, new in zip(self.outputs, (tokens, scores, rows)):
                out.copy_(new)

    def record(self, shape, fn):
        calls["capture"] += 1
        graph = Replay(shape, fn)
        graph.outputs = tuple(t.clone() for t in shape.run(fn))
        return graph, graph.outputs

    monkeypatch.setattr(GpuEngine, "_warm_up", lambda self, shape, fn: shape.run(fn))
    monkeypatch.setattr(GpuEngine, "_record_graph", record)
    ref = Decoder(index, heads, 3, engine="reference").decode(hidden_fn, 2)
    assert_same_beams(engine.decode(hidden_fn, 2), ref)
    with pytest.raises(ZeroGRError, match=r"^hidden_fn\(step=0\) returned \(2, 1, 5\), expected \(2, 1, 8\)$"):
        engine.decode(lambda step, prefixes: torch.zeros(2, 1, 5), 2)
    assert engine.graph_error is None and engine.plans[engine.key(2)].graph_error is None
    assert_same_beams(engine.decode(hidden_fn, 2), ref)
    assert calls == {"capture": 2, "replay": 2}  # captured again, and replayed


def test_a_failed_capture_is_remembered_in_the_plan_and_never_retried(monkeypatch, capsys):
    catalog, index, heads, hidden_fn = setup(seed=3, sizes=(6, 4), n=20, hidden=8)
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), 3, use_graph=False)
    engine.use_graph = True  # the capture itself is injected: no CUDA needed
    calls = {"warm_up": 0, "capture": 0}

    def warm_up(self, shape, fn):
        calls["warm_up"] += 1

    def failing_capture(self, shape, fn):
        calls["capture"] += 1
        raise RuntimeError("operation not permitted when stream is capturing\n(host sync)")

    monkeypatch.setattr(GpuEngine, "_warm_up", warm_up)
    monkeypatch.setattr(GpuEngine, "_record_graph", failing_capture)
    ref = Decoder(index, heads, 3, engine="reference").decode(hidden_fn, 2)
    for _ in range(3):  # eager fallback every time, the capture tried once
        assert_same_beams(engine.decode(hidden_fn, 2), ref)
    assert calls == {"warm_up": 1, "capture": 1}
    plan = engine.plans[engine.key(2)]
    assert plan.graph_error == "RuntimeError: operation not permitted when stream is capturing (host sync)"
    engine.decode(hidden_fn, 1)  # another shape tries its own capture
    assert calls == {"warm_up": 2, "capture": 2}

    # the plan command reports it (its sample catalog loads through Polars, absent on the GPU machine)
    pytest.importorskip("polars")
    from zerogr_core import cli

    real_init = GpuEngine.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.use_graph = True

    monkeypatch.setattr(GpuEngine, "__init__", init)
    assert cli.main(["plan", "tiny", "--device", "cpu", "--batch", "2", "--beam", "3", "--hidden", "8",
                     "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "CUDA graph: capture failed, this shape runs eagerly: RuntimeError: operation not permitted" in out
