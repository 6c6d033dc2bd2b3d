"""Cold start: plans on disk, the cost model's cut, compile-only warm-up and the warmup command."""
import dataclasses
import functools
import json
import os

import numpy as np
import pytest
import torch

import zerogr_core.decode.planner as planner
from zerogr_core import Decoder
from zerogr_core.cli import main
from zerogr_core.decode.engine import GpuEngine, StepRunner
from zerogr_core.decode.heads import Heads
from zerogr_core.decode.options import StepOption, step_options
from zerogr_core.decode.plan_store import PlanStore, resolve_store
from zerogr_core.decode.planner import CostModel, Plan, StepChoice, make_plan
from zerogr_core.decode.precompile import precompile

from test_engine import setup as engine_setup


def setup(seed=3, sizes=(6, 4), n=20, hidden=8, dtype=torch.float32, shared=False):
    """The engine tests' catalog, index, raw heads and hidden function, plus the built heads."""
    catalog, index, raw, hidden_fn = engine_setup(seed=seed, sizes=sizes, n=n, hidden=hidden, shared=shared,
                                                  dtype=dtype)
    return catalog, index, raw, Heads.build(raw, index.codebook_sizes), hidden_fn


@pytest.fixture
def timed_calls(monkeypatch):
    """Counts the planner's timed measurements (CUDA: ``median_us``; CPU: ``time_runs``'s samples)."""
    calls = []
    real_median, real_runs = planner.median_us, planner.time_runs

    def counting(fn, device, repeats=planner.REPEATS):
        calls.append(1)
        return real_median(fn, device, repeats)

    def counting_runs(fn, device, **kwargs):
        calls.append(1)
        return real_runs(fn, device, **kwargs)

    monkeypatch.setattr(planner, "median_us", counting)
    monkeypatch.setattr(planner, "time_runs", counting_runs)
    return calls


def test_plan_round_trips_through_the_store(tmp_path):
    steps = (StepChoice(0, StepOption("dense+full", "split"), {"dense+full / split": 3.5, "sparse+full / wide": 9.0},
                        {"sparse+full / small": "RuntimeError: no"}, {"sparse+selective / wide": 80.0}),
             StepChoice(1, StepOption("sparse+selective", "prune"), {"sparse+selective / prune": 1.25}))
    plan = Plan((2, 4, "float16", 32), steps, "cpu")
    store = PlanStore(tmp_path / "plans")
    key = {"shape": {"batch": 2}, "machine": {"gpu": "cpu"}}
    path = store.save(key, plan.to_dict())
    assert path.exists() and path.parent == tmp_path / "plans"
    back = Plan.from_dict(store.load(key), source="store")
    assert back.steps == plan.steps and back.key == plan.key and back.source == "store"
    assert list(back.steps[0].times_us) == list(plan.steps[0].times_us)  # option order kept
    assert store.load({"shape": {"batch": 3}, "machine": {"gpu": "cpu"}}) is None
    assert [e["path"] for e in store.entries()] == [str(path)]


def test_key_changes_when_any_field_changes(monkeypatch):
    catalog, index, raw, heads, _ = setup()
    base = GpuEngine(index, heads, 3, use_graph=False, plan_store=False)
    digest = PlanStore.digest
    keys = {digest(base.plan_key(1))}
    variants = [
        base.plan_key(2),                                                                   # batch
        GpuEngine(index, heads, 4, use_graph=False, plan_store=False).plan_key(1),          # beam
        GpuEngine(index, Heads.build([w.half() for w in raw], index.codebook_sizes), 3,
                  use_graph=False, plan_store=False).plan_key(1),                           # dtype
        GpuEngine(index, setup(hidden=16)[3], 3, use_graph=False, plan_store=False).plan_key(1),  # hidden
        GpuEngine(index, heads, 3, use_graph=False, plan_store=False, topk_paths=("wide",)).plan_key(1),
        GpuEngine(index, heads, 3, use_graph=False, plan_store=False, cost_model=None).plan_key(1),
        GpuEngine(index, heads, 3, use_graph=False, plan_store=False,
                  cost_model=CostModel(ratio=8.0)).plan_key(1),
        GpuEngine(index, heads, 3, use_graph=False, plan_store=False, plan_override=["full", "selective"]).plan_key(1),
    ]
    other = setup(seed=4, n=21)  # another catalog: other statistics
    variants.append(GpuEngine(other[1], other[3], 3, use_graph=False, plan_store=False).plan_key(1))
    shared = setup(shared=True)
    variants.append(GpuEngine(shared[1], shared[3], 3, use_graph=False, plan_store=False).plan_key(1))
    # the planner's modes: a plan stored before a mode existed never chose among it
    older = base.plan_key(1)
    older["planner"] = dict(older["planner"], modes=[m for m in older["planner"]["modes"] if m != "sparse+shared"])
    variants.append(older)
    # the machine: every field of its fingerprint counts
    machine = base.plan_key(1)["machine"]
    for field in machine:
        key = base.plan_key(1)
        key["machine"] = dict(machine, **{field: f"other-{machine[field]}"})
        variants.append(key)
    for key in variants:
        keys.add(digest(key))
    assert len(keys) == len(variants) + 1
    assert digest(base.plan_key(1)) == digest(GpuEngine(index, heads, 3, use_graph=False,
                                                        plan_store=False).plan_key(1))  # stable
    assert {"torch", "triton", "gpu"} <= set(machine)


def test_second_engine_loads_the_plan_and_times_nothing(tmp_path, timed_calls):
    catalog, index, raw, heads, hidden_fn = setup()
    store = PlanStore(tmp_path)
    first = GpuEngine(index, heads, 3, use_graph=False, plan_store=store)
    a = first.decode(hidden_fn, 2)
    plan = first.plans[first.key(2)]
    assert plan.source == "timed" and len(timed_calls) > 0
    assert store.path(first.plan_key(2)).exists()
    timed_calls.clear()
    second = GpuEngine(index, heads, 3, use_graph=False, plan_store=store)
    b = second.decode(hidden_fn, 2)
    loaded = second.plans[second.key(2)]
    assert timed_calls == [] and loaded.source == "store"
    assert [s.option for s in loaded.steps] == [s.option for s in plan.steps]
    assert loaded.steps == plan.steps
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.scores, b.scores)
    # a third engine without a store times again
    GpuEngine(index, heads, 3, use_graph=False, plan_store=False).plan(hidden_fn, 2)
    assert timed_calls


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99}), json.dumps([1, 2]),
                                     "stale-options", "other-key"])
def test_a_bad_plan_file_is_ignored_with_a_warning(tmp_path, timed_calls, content):
    catalog, index, raw, heads, hidden_fn = setup()
    store = PlanStore(tmp_path)
    engine = GpuEngine(index, heads, 3, use_graph=False, plan_store=store)
    key = engine.plan_key(1)
    path = store.path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    if content == "stale-options":  # a plan naming an option this shape cannot run
        content = json.dumps(dict(format=1, key=key, plan=dict(key=[1, 3, "float32", 8], device="cpu", steps=[
            dict(step=0, option="sparse+full / prune"), dict(step=1, option="sparse+full / wide")])))
    elif content == "other-key":
        content = json.dumps(dict(format=1, key=dict(key, shape={}), plan=dict(key=[], device="cpu", steps=[])))
    path.write_text(content)
    with pytest.warns(UserWarning, match="plan store: ignoring"):
        plan = engine.plan(hidden_fn, 1)
    assert plan.source == "timed" and timed_calls
    saved = json.loads(path.read_text())  # replaced by the fresh plan
    assert saved["key"] == json.loads(json.dumps(key))
    assert [s["option"] for s in saved["plan"]["steps"]] == [s.option.label for s in plan.steps]


def test_unwritable_store_warns_and_still_plans(tmp_path):
    catalog, index, raw, heads, hidden_fn = setup()
    blocker = tmp_path / "file"
    blocker.write_text("")
    engine = GpuEngine(index, heads, 3, use_graph=False, plan_store=blocker / "plans")
    with pytest.warns(UserWarning, match="cannot write"):
        plan = engine.plan(hidden_fn, 1)
    assert plan.source == "timed"


def test_store_switches(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROGR_CACHE_DIR", str(tmp_path / "root"))
    assert resolve_store("default").folder == tmp_path / "root" / "plans"
    assert resolve_store(False) is None and resolve_store(tmp_path).folder == tmp_path
    monkeypatch.setenv("ZEROGR_PLAN_STORE", "off")
    assert resolve_store("default") is None


def test_cost_model_keeps_the_best_two_and_every_single_option():
    model = CostModel()
    opts = [StepOption("sparse+full", p) for p in ("small", "wide")] + [StepOption("sparse+selective", "wide")]
    pred = {opts[0].label: 10.0, opts[1].label: 1000.0, opts[2].label: 5000.0}
    kept, skipped = model.select(opts, pred)
    assert kept == opts[:2] and skipped == opts[2:]  # the second best is kept though 100× the best
    assert model.select(opts[:1], {opts[0].label: 1.0}) == (opts[:1], [])
    kept, skipped = CostModel(keep=1, ratio=1.0).select(opts, {o.label: 7.0 for o in opts})
    assert kept == opts and skipped == []  # ties are kept together


def test_cost_model_predictions_follow_the_work():
    from types import SimpleNamespace

    model = CostModel()
    full, sel = StepOption("sparse+full", "wide"), StepOption("sparse+selective", "wide")
    # a late step (2,048 tokens, 8 valid per prefix on average): selective beats the GEMM in FP32 ...
    late = SimpleNamespace(kind="sparse", codebook=2048, max_segment=25, n_states=1_000_000, n_entries=8_000_000)
    assert model.predict_us(sel, late, 4096, 4096, "float32") * 4 < model.predict_us(full, late, 4096, 4096, "float32")
    # ... and the FP16 GEMM is cheaper than the FP32 one
    assert model.predict_us(full, late, 4096, 1024, "float16") < model.predict_us(full, late, 4096, 1024, "float32")
    # a step where half the codebook is valid: the GEMM wins by far
    wide = SimpleNamespace(kind="sparse", codebook=8192, max_segment=8192, n_states=2444, n_entries=10_000_000)
    assert model.predict_us(full, wide, 4096, 1024, "float16") * 4 < model.predict_us(sel, wide, 4096, 1024, "float16")
    # every option pays the floor
    assert model.predict_us(sel, late, 1, 8, "float32") >= model.floor_us


def test_cost_model_cut_and_fallback_when_every_kept_option_fails(monkeypatch):
    catalog, index, raw, heads, hidden_fn = setup()
    engine = GpuEngine(index, heads, 3, use_graph=False, plan_store=False)
    strict = CostModel(keep=1, ratio=1.0)
    plan = make_plan(engine.plan_shape(hidden_fn, 1), cost_model=strict)
    assert any(s.skipped for s in plan.steps)
    for s in plan.steps:
        assert not set(s.skipped) & set(s.times_us)
    # break every option the strict model keeps at step 2: the planner must time the skipped ones
    kept, skipped = set(plan.steps[1].times_us), set(plan.steps[1].skipped)
    assert kept and skipped
    real, real_record = StepRunner.select, GpuEngine.record_inputs
    probing = []

    def record(self, *args, **kwargs):  # the probe decode runs; only the timed calls break
        probing.append(1)
        try:
            return real_record(self, *args, **kwargs)
        finally:
            probing.pop()

    def broken(self, slots, scores, prefixes=None):
        if self.option.label in kept and self.mapping.step == 1 and not probing:
            raise RuntimeError("does not compile here")
        return real(self, slots, scores, prefixes)

    monkeypatch.setattr(StepRunner, "select", broken)
    monkeypatch.setattr(GpuEngine, "record_inputs", record)
    step = make_plan(engine.plan_shape(hidden_fn, 1), cost_model=strict).steps[1]
    assert step.option.label in skipped and set(step.failed) == kept and not step.skipped
    every = {o.label for o in step_options(index.steps[1], 3, 3)}
    assert set(step.times_us) | set(step.failed) == every


def test_engine_reports_planning_progress():
    catalog, index, raw, heads, hidden_fn = setup()
    seen = []
    engine = GpuEngine(index, heads, 3, use_graph=False, plan_store=False,
                       progress=lambda f, text: seen.append((f, text)))
    engine.decode(hidden_fn, 1)
    texts = [t for _, t in seen]
    assert texts[0].startswith("compiling the kernels of") and "step 2 of 2: timing" in " | ".join(texts)
    assert all(0.0 <= f <= 1.0 for f, _ in seen) and [f for f, _ in seen] == sorted(f for f, _ in seen)


INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="CPU tensors take the Triton path only under the interpreter")


@INTERPRETER
def test_precompile_runs_launchers_without_their_kernels():
    from zerogr_kernels import filter_slots

    catalog, index, raw, heads, hidden_fn = setup()
    step = index.steps[1]
    states = torch.tensor([0, 1, 2], dtype=torch.int64)
    args = step.filter_args()
    want = filter_slots(states, step.slot_width, **args)
    out = type(want)(*(torch.full_like(t, 7) for t in want))
    ran = precompile([lambda: filter_slots(states, step.slot_width, **args, out=out)], "cpu")
    assert ran == 1
    assert all(bool((t == 7).all()) for t in out)  # compile only: the kernel did not write
    got = filter_slots(states, step.slot_width, **args, out=out)  # a real call runs after it
    assert torch.equal(got.slot_tokens, want.slot_tokens) and torch.equal(got.slot_succ, want.slot_succ)
    assert precompile([lambda: 1 / 0], "cpu") == 0  # a failing call is left to its real call
    assert precompile([lambda: None], "cpu", workers=0) == 0


@INTERPRETER
def test_every_option_runs_in_compile_only_mode():
    # compile-only launches leave outputs unwritten: no launcher may index with what its
    # kernels wrote (on a GPU that would be a device-side assert, not an exception)
    catalog, index, raw, heads, hidden_fn = setup(sizes=(12, 6, 5), n=150, hidden=24)
    engine = GpuEngine(index, heads, 6, use_graph=False, plan_store=False)
    calls = [functools.partial(planner._run_on_zeros, engine.plan_shape(hidden_fn, 2), level, o)
             for level, opts in enumerate(engine.options_for(2)) for o in opts]
    assert precompile(calls, "cpu") == len(calls)


def test_engine_with_a_stored_plan_matches_the_reference(tmp_path):
    catalog, index, raw, heads, hidden_fn = setup(sizes=(12, 6, 5), n=150, hidden=24)
    store = PlanStore(tmp_path)
    GpuEngine(index, heads, 6, use_graph=False, plan_store=store).plan(hidden_fn, 2)
    engine = GpuEngine(index, heads, 6, use_graph=False, plan_store=store)
    out = engine.decode(hidden_fn, 2)
    plan = engine.plans[engine.key(2)]
    assert plan.source == "store"
    proj = ["full" if s.option.mode.endswith("full") else "selective" for s in plan.steps]
    ref = Decoder(index, raw, 6, engine="reference", projection=proj).decode(hidden_fn, 2)
    assert torch.equal(out.tokens, ref.tokens)
    torch.testing.assert_close(out.scores, ref.scores, rtol=1e-4, atol=1e-4)


def test_warmup_command_writes_the_store_and_plan_reads_it(tmp_path, capsys, timed_calls):
    path = tmp_path / "cat.csv"
    rng = np.random.default_rng(0)
    sids = np.unique(np.stack([rng.integers(0, 6, 20), rng.integers(0, 4, 20)], 1), axis=0)
    path.write_text("item_id,s1,s2\n" + "".join(f"{i},{a},{b}\n" for i, (a, b) in enumerate(sids)))
    plans = tmp_path / "plans"
    common = [str(path), "--beam", "3", "--dtype", "fp32", "--hidden", "8", "--device", "cpu",
              "--plan-dir", str(plans)]
    assert main(["warmup", *common, "--batch", "1,2", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["batch"], r["source"]) for r in records] == [(1, "timed"), (2, "timed")]
    assert len(list(plans.glob("*.json"))) == 2
    timed_calls.clear()
    assert main(["warmup", *common, "--batch", "2"]) == 0
    assert "already stored" in capsys.readouterr().out and not timed_calls
    assert main(["plan", *common, "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "plan from the store:" in out and not timed_calls
    assert main(["plan", *common, "--batch", "2", "--no-plan-store", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "timed"
    assert main(["warmup", *common, "--hidden", "8,16"]) == 2
    assert "--hidden" in capsys.readouterr().err
    assert main(["warmup", *common, "--batch", "two"]) == 2
    assert "--batch: 'two'" in capsys.readouterr().err
    assert main(["warmup", *common, "--dtype", "fp8"]) == 2
    assert "--dtype" in capsys.readouterr().err


def test_plan_and_warmup_default_to_the_dtype_the_device_serves(tmp_path, capsys, timed_calls):
    # float32 on a CPU: its float16 matmuls are far slower, and no CPU server runs them
    common = ["tiny", "--beam", "3", "--hidden", "8", "--device", "cpu", "--plan-dir", str(tmp_path), "--batch", "2"]
    assert main(["warmup", *common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
    timed_calls.clear()
    assert main(["plan", *common, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["dtype"], plan["source"]) == ("float32", "store") and not timed_calls


def test_cost_model_presets_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        planner.DEFAULT_COST_MODEL.ratio = 2.0
    assert planner.COST_MODELS["off"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_precompile_leaves_nothing_to_compile_on_gpu(monkeypatch):
    import triton

    catalog, index, raw, heads, _ = setup(sizes=(300, 40, 30), n=5000, hidden=72, dtype=torch.float16)
    index = index.to("cuda")
    heads = Heads.build([w.cuda() for w in raw], index.codebook_sizes)
    table = torch.randn(64, 72, device="cuda").half()

    def hidden_fn(step, prefixes):  # pure GPU work
        return table[((prefixes.clamp(min=0) * 7 + 3).sum(-1) + step * 13) % 64]
    engine = GpuEngine(index, heads, 24, use_graph=False, plan_store=False, cost_model=None)
    calls = [functools.partial(planner._run_on_zeros, engine.plan_shape(hidden_fn, 3), level, o)
             for level, opts in enumerate(engine.options_for(3)) for o in opts]
    compiles = []

    def hook(*args, **kwargs):  # called before every JIT compilation (disk-cache hits included)
        compiles.append(1)
        return None

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", hook)
    assert precompile(calls, "cuda", workers=4) == len(calls)
    before = len(compiles)
    for call in calls:  # the real launches
        call()
    torch.cuda.synchronize()
    assert len(compiles) == before  # every kernel was compiled by the compile-only pass
    # and the engine decodes as the reference does after a compile-only warm-up
    out = engine.decode(hidden_fn, 3)
    plan = engine.plans[engine.key(3)]
    proj = ["full" if st.option.mode.endswith("full") else "selective" for st in plan.steps]
    ref = Decoder(index, [w.cuda() for w in raw], 24, engine="reference", projection=proj).decode(hidden_fn, 3)
    assert torch.equal(out.tokens, ref.tokens)
