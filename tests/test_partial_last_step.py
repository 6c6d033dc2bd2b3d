"""The last step's wanted beams: a step model asked for the beams in branching states only
returns the decode a full last step does (filtering first), and the loop counts them right."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("transformers")

from zerogr_core import Catalog, build_index  # noqa: E402
from zerogr_core.decode import loop as loop_module  # noqa: E402
from zerogr_core.decode.constraints import build_lists  # noqa: E402
from zerogr_core.decode.loop import ROW_GRANULE, partial_rows  # noqa: E402
from zerogr_core.errors import ZeroGRError  # noqa: E402
from zerogr_core.models.protocol import StepDecoder  # noqa: E402
from zerogr_core.models.qwen3 import Qwen3StepModel, build_random  # noqa: E402

from test_partial_last_step_models import check_equal_decodes, check_graphs_against_reference  # noqa: E402
from test_qwen3 import OFFSETS, SHAPE, inputs, tiny_catalog  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return build_random(SHAPE, seed=3)[0]


class Spy(Qwen3StepModel):
    """Records the ``rows`` each last step was asked for."""

    def step(self, step, tokens, parents, wanted=None, rows=None):
        if wanted is not None:
            self.asked.append((int(wanted.sum(dim=1).max()), rows, tokens.shape[1]))
        return super().step(step, tokens, parents, wanted=wanted, rows=rows)


def decoder(model, index, beam, partial: bool):
    sm = Spy(model, OFFSETS, context_bucket=8)
    sm.asked = []
    sm.partial_last_step = partial
    return StepDecoder(sm, index, sm.head, beam_width=beam, band_offsets=OFFSETS), sm


def test_the_option_takes_a_bool_only(model):
    with pytest.raises(ZeroGRError, match="partial_last_step: expected True or False, got 'yes'"):
        Qwen3StepModel(model, OFFSETS, partial_last_step="yes")


def test_partial_rows():
    assert partial_rows(0, 256) == 0
    assert partial_rows(1, 256) == ROW_GRANULE
    assert partial_rows(161, 256) == 176
    assert partial_rows(250, 256) == 256
    assert partial_rows(5, 6) == 6


@pytest.mark.parametrize("granule", [1, 16])
@pytest.mark.parametrize("beam", [6, 48])
@pytest.mark.parametrize("lists", [None, "request", "catalog"])
def test_partial_last_step_returns_the_full_decode(model, monkeypatch, granule, beam, lists):
    monkeypatch.setattr(loop_module, "ROW_GRANULE", granule)
    catalog = tiny_catalog(n=24)                     # 24 items under at most 20 two-token prefixes
    index = build_index(catalog)
    ids, mask = inputs()
    got = {}
    for partial in (True, False):
        run, sm = decoder(model, index, beam, partial)
        req = None
        if lists is not None:
            allow = [catalog.item_ids[[1, 4, 9, 16, 20, 22]], None, None]
            deny = [None, catalog.item_ids[::3], catalog.item_ids[[0, 5]]]
            req = build_lists(catalog, 3, allow, deny, normalise=lists)
        got[partial] = (run.decode(ids, mask, lists=req), sm.asked)
    check_equal_decodes(got, granule)


def test_wanted_rows_equal_the_full_step_and_the_rest_are_zero(model):
    ids, mask = inputs()
    beam, b = 8, ids.shape[0]
    gen = torch.Generator().manual_seed(4)
    tokens = [torch.randint(0, s, (b, beam), generator=gen).int() for s in SHAPE.codebook_sizes[:2]]
    parents = [torch.arange(b)[:, None].expand(b, beam).contiguous(),
               torch.arange(b)[:, None] * beam + torch.randint(0, beam, (b, beam), generator=gen)]
    wanted = torch.rand(b, beam, generator=gen) < 0.4
    wanted[0] = False                                               # a request with nothing wanted
    outs = []
    for kw in ({}, {"wanted": wanted, "rows": int(wanted.sum(1).max()) + 1}):
        sm = Qwen3StepModel(model, OFFSETS, context_bucket=8)
        sm.prefill(ids, mask, beam_width=beam)
        sm.step(0, None, None)
        sm.step(1, tokens[0], parents[0])
        outs.append(sm.step(2, tokens[1], parents[1], **kw).view(b, beam, -1))
        again = sm.step(2, tokens[1], parents[1], **kw).view(b, beam, -1)
        assert torch.equal(again, outs[-1])                        # the last step may run again
    full, part = outs
    computed = (part != 0).any(dim=-1)              # the wanted beams, then others up to ``rows``
    assert computed[wanted].all() and (computed.sum(dim=1) == int(wanted.sum(1).max()) + 1).all()
    torch.testing.assert_close(part[computed], full[computed], rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 5)), min_size=1, max_size=60,
                unique=True), st.integers(0, 2**31 - 1))
def test_branches_counts_each_states_tokens(sids, seed):
    catalog = Catalog.from_sids(np.array(sorted(sids)), (4, 5, 6))
    index = build_index(catalog)
    rng = np.random.default_rng(seed)
    for level, mapping in enumerate(index.steps):
        states = torch.as_tensor(rng.integers(-1, mapping.n_states, 20), dtype=torch.int64)
        got = mapping.branches(states).tolist()
        for s, g in zip(states.tolist(), got):
            want = s >= 0 and len(mapping.next_tokens(s)) > 1
            assert g == want, (level, s)


def test_the_llm_bench_runs_it(tmp_path):
    """``python -m zerogr_core.bench.llm`` builds its step models with it, unless told
    ``--no-partial-last-step``."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "zerogr_core.bench.llm", "--quick", "--out", str(tmp_path),
                          "--shapes", "16x2", "--no-hf", "--agreement-requests", "0", "--no-partial-last-step"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    recs = json.loads((tmp_path / "llm.json").read_text())["records"]
    assert next(r for r in recs if r.get("method") == "setup")["config"]["partial_last_step"] is False
    ours = [r for r in recs if r.get("method") == "zerogr"]
    assert ours and all(r["items_in_catalog"] and r["valid_fraction"] == 1.0 for r in ours)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("lists", [None, "request"])
def test_cuda_graphs_of_the_last_step_equal_the_reference(monkeypatch, lists):
    """On a GPU the engine captures the steps before the last, then one graph of the last step
    per count of wanted beams: new requests replay them and return the CPU reference's beams."""
    monkeypatch.setattr(loop_module, "ROW_GRANULE", 2)
    catalog = tiny_catalog(n=24)
    cpu = build_random(SHAPE, seed=3)[0]
    ref, _ = decoder(cpu, build_index(catalog), 8, partial=False)
    gpu = Qwen3StepModel(build_random(SHAPE, seed=3)[0].cuda(), OFFSETS, context_bucket=8)
    # not the Spy: it reads the count on the host, which a graph being captured may not
    run = StepDecoder(gpu, build_index(catalog, device="cuda"), gpu.head, beam_width=8, band_offsets=OFFSETS)
    check_graphs_against_reference(run, ref, catalog, inputs, lists, 8)
