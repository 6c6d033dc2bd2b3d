"""The Qwen3 step model against Hugging Face's own forward, ``generate`` and brute force."""
import re

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from zerogr_core import Catalog, build_index  # noqa: E402
from zerogr_core.decode.constraints import build_lists  # noqa: E402
from zerogr_core.errors import ZeroGRError  # noqa: E402
from zerogr_core.models.protocol import StepDecoder  # noqa: E402
from zerogr_core.models.qwen3 import QWEN3_PRESETS, Qwen3Preset, Qwen3StepModel, build_random  # noqa: E402

from test_hf import allowed_next, assert_request_is  # noqa: E402

SHAPE = Qwen3Preset("test", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, base_vocab=16,
                    codebook_sizes=(4, 5, 6), rope_theta=10_000.0, max_positions=256)
OFFSETS = SHAPE.token_offsets


@pytest.fixture(scope="module")
def model():
    return build_random(SHAPE, seed=3)[0]


def tiny_catalog(n=40, seed=0, sizes=SHAPE.codebook_sizes):
    rng = np.random.default_rng(seed)
    sids = set()
    while len(sids) < n:
        sids.add(tuple(int(rng.integers(0, s)) for s in sizes))
    return Catalog.from_sids(np.array(sorted(sids)), sizes)


def inputs(seed=0):
    """Three requests of lengths 9, 5 and 12 (right padding)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, SHAPE.base_vocab, (3, 12), generator=gen)
    mask = (torch.arange(12)[None, :] < torch.tensor([[9], [5], [12]])).long()
    return ids * mask, mask


@torch.no_grad()
def hf_hidden(model, context, sid):
    full = torch.cat([context, torch.tensor([OFFSETS[i] + t for i, t in enumerate(sid)], dtype=torch.int64)])
    return model.model(input_ids=full[None]).last_hidden_state[0, -1]


@torch.no_grad()
def next_logprobs(model, context, sid):
    full = torch.cat([context, torch.tensor([OFFSETS[i] + t for i, t in enumerate(sid)], dtype=torch.int64)])
    return torch.log_softmax(model(input_ids=full[None]).logits[0, -1].double(), dim=-1)


def brute_force(model, sids, context, beam, order):
    """Plain beam search over the prefix tree of ``sids`` with logits recomputed from scratch."""
    sids = [tuple(int(t) for t in row) for row in sids]
    beams = [((), 0.0)]
    for level in range(len(OFFSETS)):
        cands = []
        for prefix, score in beams:
            children = sorted({s[level] for s in sids if s[:level] == prefix})
            lp = next_logprobs(model, context, list(prefix))
            band = torch.tensor([OFFSETS[level] + t for t in children])
            vals = lp[band] if order == "score-first" else torch.log_softmax(lp[band], dim=0)
            cands += [(prefix + (t,), score + float(v)) for t, v in zip(children, vals)]
        beams = sorted(cands, key=lambda c: -c[1])[:beam]
    return beams


def serving(model, index, beam, order="filter-first", prefill="auto", bucket=8):
    step_model = Qwen3StepModel(model, OFFSETS, context_bucket=bucket)
    return StepDecoder(step_model, index, step_model.head, beam_width=beam, order=order, band_offsets=OFFSETS,
                       prefill=prefill)


def test_steps_equal_hf_forward(model):
    """Per-step hidden states = HF's full forward over context + SID tokens, beams reordered by parent."""
    ids, mask = inputs()
    beam, b = 4, ids.shape[0]
    sm = Qwen3StepModel(model, OFFSETS, context_bucket=8)
    sm.prefill(ids, mask, beam_width=beam)
    contexts = [ids[r][mask[r] > 0] for r in range(b)]
    h0 = sm.step(0, None, None)
    for r in range(b):
        torch.testing.assert_close(h0[r], hf_hidden(model, contexts[r], []), rtol=1e-5, atol=1e-5)
    gen = torch.Generator().manual_seed(1)
    lineage = [[[] for _ in range(beam)] for _ in range(b)]
    prev = 1
    for step in range(1, len(OFFSETS)):
        local = torch.randint(0, prev, (b, beam), generator=gen)
        parents = torch.arange(b)[:, None] * prev + local
        tokens = torch.randint(0, SHAPE.codebook_sizes[step - 1], (b, beam), generator=gen).int()
        lineage = [[lineage[r][int(local[r, m])] + [int(tokens[r, m])] for m in range(beam)] for r in range(b)]
        h = sm.step(step, tokens, parents).view(b, beam, -1)
        for r in range(b):
            for m in range(beam):
                torch.testing.assert_close(h[r, m], hf_hidden(model, contexts[r], lineage[r][m]),
                                           rtol=1e-5, atol=1e-5)
        prev = beam


@pytest.mark.parametrize("order", ["filter-first", "score-first"])
def test_decode_matches_brute_force(model, order):
    catalog = tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    for beam in (6, 48):                  # 48 ≥ the 40 items: beam search is exhaustive
        result = serving(model, index, beam, order).decode(ids, mask)
        for r in range(ids.shape[0]):
            want = brute_force(model, catalog.sids, ids[r][mask[r] > 0], beam, order)
            assert_request_is(result, r, want, catalog)


def test_score_first_equals_hf_generate(model):
    """Scoring first = HF generate(num_beams=M, prefix_allowed_tokens_fn=...) in FP32, beams and scores."""
    catalog = tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    L, beam = catalog.n_levels, 8
    prefixes = allowed_next(catalog.sids, OFFSETS)
    ours = serving(model, index, beam, "score-first").decode(ids, mask)
    for r in range(ids.shape[0]):
        context = ids[r][mask[r] > 0][None]
        start = context.shape[1]

        def allowed(batch_id, sent):
            return sorted(prefixes.get(tuple(sent[start:].tolist()), ()))

        out = model.generate(input_ids=context, attention_mask=torch.ones_like(context), num_beams=beam,
                             num_return_sequences=beam, prefix_allowed_tokens_fn=allowed, do_sample=False,
                             length_penalty=0.0, early_stopping=True, max_new_tokens=L, min_new_tokens=L,
                             return_dict_in_generate=True, output_scores=True, pad_token_id=0)
        hf_seq = out.sequences[:, start:] - torch.tensor(OFFSETS)
        hf_scores = out.sequences_scores
        real = hf_scores > -1e8
        alive = ours.scores[r] > float("-inf")
        assert torch.equal(real, alive)
        assert torch.equal(ours.tokens[r][alive], hf_seq[real])
        torch.testing.assert_close(ours.scores[r][alive], hf_scores[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["filter-first", "score-first", "unconstrained"])
def test_padded_batch_equals_one_at_a_time(model, order):
    catalog = tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    batched = serving(model, index, 5, order).decode(ids, mask)
    left = torch.zeros_like(ids)
    for r in range(ids.shape[0]):
        keep = mask[r].bool()
        n = int(keep.sum())
        left[r, ids.shape[1] - n:] = ids[r, keep]
        alone = serving(model, index, 5, order, bucket=3).decode(ids[r:r + 1, keep])
        assert torch.equal(batched.item_rows[r], alone.item_rows[0]), r
        torch.testing.assert_close(batched.scores[r], alone.scores[0], rtol=1e-5, atol=1e-5)
    # the same requests left-padded, as Hugging Face tokenizers pad a causal LM's prompts
    lefted = serving(model, index, 5, order).decode(left, mask.flip(1))
    assert torch.equal(lefted.item_rows, batched.item_rows)


def test_staged_prefill_equals_eager(model):
    catalog = tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs(2)
    kept = serving(model, index, 6, prefill="inside")
    for seed in (2, 3):
        ids, mask = inputs(seed)
        a = kept.decode(ids, mask)
        b = serving(model, index, 6, prefill="outside").decode(ids, mask)
        assert kept.stage
        assert torch.equal(a.item_rows, b.item_rows)
        torch.testing.assert_close(a.scores, b.scores)


def test_restaging_writes_what_a_fresh_model_stages(model):
    """Stage skips the padding's zeroing and the lengths' fill when the last call left them right: a
    run of calls of other lengths (one bucket), with and without a mask, leaves the static buffers
    as a fresh model's staging of the last call leaves them."""
    ids, mask = inputs(4)
    calls = [(ids, None), (ids[:, :5], None), (ids[:, :5], None), (ids, mask), (ids[:, :7], None),
             (ids[:, :9], mask[:, :9] * 0 + 1), (ids[:, :9], None), (ids[:, :3], None)]
    kept = Qwen3StepModel(model, OFFSETS, context_bucket=16)
    for history, m in calls:
        kept.stage(history, m, beam_width=2)
        fresh = Qwen3StepModel(model, OFFSETS, context_bucket=16)
        fresh.stage(history, m, beam_width=2)
        assert torch.equal(kept.ids, fresh.ids) and torch.equal(kept.lengths, fresh.lengths), history.shape


def test_allow_and_deny_lists(model):
    """Filtering first under lists = brute force over the sub-catalog the lists leave."""
    catalog = tiny_catalog()
    index = build_index(catalog)
    ids, mask = inputs()
    run = serving(model, index, 6)
    allow = [catalog.item_ids[[1, 4, 9, 16, 25, 36, 38]], None, None]
    deny = [None, catalog.item_ids[::3], None]
    lists = build_lists(catalog, 3, allow, deny)
    result = run.decode(ids, mask, lists=lists)
    keep = [np.isin(catalog.item_ids, allow[0]), ~np.isin(catalog.item_ids, deny[1]),
            np.ones(catalog.n_items, dtype=bool)]
    for r in range(3):
        want = brute_force(model, catalog.sids[keep[r]], ids[r][mask[r] > 0], 6, "filter-first")
        alive = result.scores[r] > float("-inf")
        assert [tuple(t) for t in result.tokens[r][alive].tolist()] == [w[0] for w in want]
        items = catalog.item_ids[result.item_rows[r][alive].numpy()]
        assert keep[r][np.searchsorted(catalog.item_ids, items)].all()


def test_errors(model):
    sm = Qwen3StepModel(model, OFFSETS)
    ids, mask = inputs()
    holes = mask.clone()
    holes[0, 3] = 0
    with pytest.raises(ZeroGRError, match="contiguous run"):
        sm.prefill(ids, holes, beam_width=2)
    with pytest.raises(ZeroGRError, match="row 2 has no token"):
        sm.prefill(ids, mask * torch.tensor([[1], [1], [0]]), beam_width=2)
    bad = ids.clone()
    bad[1, 0] = SHAPE.vocab
    with pytest.raises(ZeroGRError, match=r"input_ids: row 1 has ids outside"):
        sm.prefill(bad, mask, beam_width=2)
    with pytest.raises(ZeroGRError, match=r"input_ids: row 1 has ids outside"):
        sm.prefill(bad, None, beam_width=2)
    bad[1, 0] = -1
    with pytest.raises(ZeroGRError, match=r"input_ids: row 1 has ids outside"):
        sm.prefill(bad, None, beam_width=2)
    with pytest.raises(ZeroGRError, match="input_ids: expected a"):
        sm.prefill(ids[0], None, beam_width=2)
    for width in (0, True, 2.0):  # True passed as a beam of 1
        with pytest.raises(ZeroGRError, match=rf"^beam_width must be a positive integer, got {width!r}$"):
            sm.prefill(ids, mask, beam_width=width)
    with pytest.raises(ZeroGRError, match="call prefill before step"):
        Qwen3StepModel(model, OFFSETS).step(0, None, None)
    with pytest.raises(ZeroGRError, match="unknown Qwen3 preset 'huge'"):
        build_random("huge")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=40, n_embd=8, n_layer=1, n_head=2))
    with pytest.raises(ZeroGRError, match="expected a Qwen3ForCausalLM"):
        Qwen3StepModel(gpt2, OFFSETS)


@pytest.mark.parametrize("prefill", ["inside", "outside"])
def test_deferred_range_check(model, monkeypatch, prefill):
    """Ids on the model's GPU are range-checked after the launch (StagedRange), here forced on the CPU:
    a bad id raises the one-line error naming its row (the clamped prefill never indexes past the
    table), the decode after it is unharmed, and good ids decode exactly as with the check first."""
    import zerogr_core.models.qwen3 as qwen3

    index = build_index(tiny_catalog())
    ids, _ = inputs(5)
    want = serving(model, index, 6, prefill=prefill).decode(ids)
    monkeypatch.setattr(qwen3, "defers_range", lambda history, device: True)
    run = serving(model, index, 6, prefill=prefill)
    for value, row in ((SHAPE.vocab, 2), (-3, 0), (SHAPE.vocab + 1000, 1)):
        bad = ids.clone()
        bad[row, 4] = value
        with pytest.raises(ZeroGRError, match=rf"^input_ids: row {row} has ids outside the model's vocabulary "
                                              rf"\[0, {SHAPE.vocab}\)$"):
            run.decode(bad)
        assert not run.step_model._range.pending
        got = run.decode(ids)
        assert torch.equal(got.item_rows, want.item_rows)
        torch.testing.assert_close(got.scores, want.scores)
    sm = Qwen3StepModel(model, OFFSETS)
    bad = ids.clone()
    bad[1, 0] = SHAPE.vocab
    with pytest.raises(ZeroGRError, match="input_ids: row 1 has ids outside"):
        sm.prefill(bad, None, beam_width=2)


def test_token_offsets_are_checked(model):
    """Qwen3StepModel took its offsets through int(): 16.7 became 16 and True 1 (level 1's ids
    moved, silently), "16" and () were accepted; now through the check HFStepModel and
    T5StepModel use (models.hf.step_offsets), with the same one-line messages."""
    vocab = SHAPE.vocab
    for bad, message in (((16, 20, vocab), rf"level 3 starts at id {vocab}, outside the model's vocabulary "
                                           rf"\[0, {vocab}\)"),
                         ((-1, 20, 25), rf"level 1 starts at id -1, outside the model's vocabulary \[0, {vocab}\)"),
                         ((16.7, 20, 25), r"expected one integer per SID level, got \(16.7, 20, 25\)"),
                         ((True, 20, 25), r"expected one integer per SID level, got \(True, 20, 25\)"),
                         (("16", 20, 25), r"expected one integer per SID level, got \('16', 20, 25\)"),
                         (16, r"expected one integer per SID level, got 16"),
                         ((), r"expected one integer per SID level, got \(\)")):
        with pytest.raises(ZeroGRError, match=rf"^token_offsets: {message}$"):
            Qwen3StepModel(model, bad)
    assert Qwen3StepModel(model, (16.0, np.int64(20), torch.tensor(25))).token_offsets == OFFSETS



def test_context_bucket_takes_whole_numbers_only(model):
    """context_bucket went through int(): 2.5 became 2 and "x" raised a bare ValueError."""
    for bad in (2.5, "x", "8", 0, -4, True, float("nan"), None):
        message = rf"^context_bucket: expected an integer ≥ 1, got {re.escape(repr(bad))}$"
        with pytest.raises(ZeroGRError, match=message):
            Qwen3StepModel(model, OFFSETS, context_bucket=bad)
    for good in (8, 8.0, np.int64(8), torch.tensor(8)):
        assert Qwen3StepModel(model, OFFSETS, context_bucket=good).context_bucket == 8

def test_stacked_weights_are_the_modules_own():
    """Wrapping stacks q/k/v and gate/up once: the module's parameters become views of the stacks
    (no copy, HF's forward unchanged), and a second wrap reuses them."""
    m = build_random(SHAPE, seed=4)[0]
    ids = torch.randint(1, SHAPE.base_vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = m(ids).logits
    first = Qwen3StepModel(m, OFFSETS)
    second = Qwen3StepModel(m, OFFSETS)
    for i, layer in enumerate(m.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        assert attn.q_proj.weight.data_ptr() == first.qkv_weight[i].data_ptr() == second.qkv_weight[i].data_ptr()
        assert attn.v_proj.weight.data_ptr() == first.qkv_weight[i][-attn.v_proj.weight.shape[0]:].data_ptr()
        assert mlp.up_proj.weight.data_ptr() == second.gate_up_weight[i][mlp.gate_proj.weight.shape[0]:].data_ptr()
        torch.testing.assert_close(second.qkv_weight[i], torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                                                    attn.v_proj.weight]), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, before, rtol=0, atol=0)


def test_presets():
    big = QWEN3_PRESETS["qwen3-1.7b"]
    assert big.vocab == 151_936 + 3 * 8192 and big.token_offsets == (151_936, 160_128, 168_320)
    # Qwen3-1.7B: about 1.4 B parameters outside the embedding
    assert 1.3e9 < big.non_embedding_params() < 1.5e9
    tiny, preset = build_random("tiny")
    assert preset is QWEN3_PRESETS["tiny"]
    assert tiny.model.embed_tokens.weight.shape == (preset.vocab, preset.hidden)
    assert tiny.get_output_embeddings().weight.data_ptr() == tiny.model.embed_tokens.weight.data_ptr()


def test_bench_quick(tmp_path):
    """``python -m zerogr_core.bench.llm --quick`` runs the whole matrix on the tiny shape."""
    import json
    import os
    import subprocess
    import sys

    # the CPU path is the kernels' PyTorch references: the Triton interpreter is not needed there
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "zerogr_core.bench.llm", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "llm.json").read_text())
    assert doc["finished"]
    recs = doc["records"]
    ours = [r for r in recs if r.get("method") == "zerogr"]
    assert len(ours) == 2 * 2 + 2
    assert all(r["items_in_catalog"] and r["valid_fraction"] == 1.0 for r in ours)
    assert all(r["prefill_ms"] > 0 and r["decode_ms"] > 0 for r in ours)
    methods = {r.get("method") for r in recs}
    assert {"zerogr-score-first", "zerogr-unconstrained", "hf-constrained", "hf-unconstrained"} <= methods
    agree = next(r for r in recs if r.get("method") == "agreement")
    assert agree["top1_agreement"] == 1.0          # float32: the same items as HF's own forward
    assert agree["hf_attentions"]["top1"] == 1.0   # and HF's eager attention the same as its SDPA
    table = (tmp_path / "llm.md").read_text()
    assert "| 16 | 2 | 8 |" in table and "with SDPA against eager attention, the same requests: top-1 item 100% " \
        "(95 % interval" in table
    assert agree["top1_agreed"] == agree["requests"] and agree["top1_interval95"][1] == 1.0


def test_a_spent_budget_skips_the_shapes_never_the_agreement(tmp_path):
    """A budget already spent when the run starts (it counts the model's build): every shape is
    recorded as skipped, and the agreement check still runs, first."""
    from dataclasses import replace

    from zerogr_core.bench.llm import LLM_PRESETS, run

    cfg = replace(LLM_PRESETS["quick"], budget_s=0.0, agreement_requests=2, shapes=((16, 1),))
    recs = run(cfg, tmp_path, "test", log=lambda *_: None)
    methods = [r["method"] for r in recs]
    assert methods[1] == "agreement" and recs[1]["requests"] == 2, methods
    assert [r["what"] for r in recs if r["method"] == "skipped"] == ["shape context 16 batch 1 beam 8",
                                                                      "hf context 16 batch 1 beam 8"]
    assert "zerogr" not in methods


def test_agreement_interval_is_wilsons():
    """The agreement's 95 % interval: Wilson's score interval of the top-1 share (the known value at 49
    of 60), inside [0, 1], holding the share, and narrower with more requests."""
    from zerogr_core.bench.llm_agreement import interval95

    lo, hi = interval95(49, 60)
    assert abs(lo - 0.70080) < 1e-4 and abs(hi - 0.89442) < 1e-4, (lo, hi)
    assert interval95(0, 20)[0] == 0.0 and interval95(20, 20)[1] == 1.0
    for k, n in [(0, 1), (1, 1), (3, 7), (55, 60), (999, 1000)]:
        lo, hi = interval95(k, n)
        assert 0.0 <= lo <= k / n <= hi <= 1.0, (k, n, lo, hi)
    wide, narrow = interval95(49, 60), interval95(490, 600)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert interval95(0, 0) == (0.0, 1.0)


def test_agreement_reports_each_bf16_path_against_float32():
    """The benchmark's agreement check in bf16: ours against Hugging Face's forward, and both
    against the float32 computation over the same weights, per request with its margin."""
    from dataclasses import replace

    from zerogr_core.bench.llm import LLM_PRESETS, Workload
    from zerogr_core.bench.llm_agreement import agreement

    w = Workload(replace(LLM_PRESETS["quick"], dtype="bfloat16", agreement_requests=2), log=lambda *_: None)
    rec = agreement(w, 16, 8)
    assert rec["requests"] == 2 and 0.0 <= rec["top1_agreement"] <= 1.0 and 0.0 < rec["topk_overlap"] <= 1.0
    for path in ("ours", "hf"):
        assert 0.0 <= rec["float32"][path]["top1"] <= 1.0 and 0.0 < rec["float32"][path]["topk_overlap"] <= 1.0
    both = rec["hf_attentions"]
    assert 0.0 <= both["top1"] <= 1.0 and 0.0 < both["topk_overlap"] <= 1.0 and "eager" in both["pair"]
    assert w.model.config._attn_implementation == "sdpa"   # switched back
    detail = rec["requests_detail"]
    assert len(detail) == 2 and all(d["margin"] >= 0.0 for d in detail)     # the beams come best first
    assert np.mean([d["ours_vs_hf"] for d in detail]) == rec["top1_agreement"]


def test_agreement_float32_falls_back_to_our_forward_when_hugging_faces_does_not_fit(monkeypatch):
    """Where Hugging Face's float32 forward runs out of memory (its cache holds the context once
    per beam), the float32 computation is our step model's over the same upcast weights: on the
    tiny model it returns the same items as Hugging Face's, so every figure is the same."""
    from dataclasses import replace

    from zerogr_core import hf
    from zerogr_core.bench.llm import LLM_PRESETS, Workload, markdown
    from zerogr_core.bench.llm_agreement import _against_float32

    w = Workload(replace(LLM_PRESETS["quick"], dtype="bfloat16", agreement_requests=3), log=lambda *_: None)
    inputs = [w.inputs(1, 16, 50_000 + r) for r in range(3)]
    ours = w.serving("score-first", "outside", 8)
    theirs = hf.HFGenerator(w.model, w.index, beam_width=8, token_offsets=w.offsets, order="score-first")
    got = {"ours": [ours.decode(i).item_rows[0].numpy() for i in inputs],
           "hf": [theirs.generate(i).item_rows[0].numpy() for i in inputs]}
    want = _against_float32(w, inputs, got, 8)
    assert "HFStepModel" in want["float32"]["reference"]
    generate = hf.HFGenerator.generate

    def no_float32_memory(self, *args, **kwargs):
        if self.step_model.model.dtype == torch.float32:
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(hf.HFGenerator, "generate", no_float32_memory)
    fell_back = _against_float32(w, inputs, got, 8)
    assert "Qwen3StepModel" in fell_back["float32"]["reference"]
    for name in ("ours", "hf"):
        assert fell_back["float32"][name] == want["float32"][name], name
    assert [d["margin"] for d in fell_back["requests_detail"]] == pytest.approx(
        [d["margin"] for d in want["requests_detail"]], abs=1e-4)
    rec = dict(method="agreement", requests=3, context=16, beam=8, top1_agreement=1.0, topk_overlap=1.0,
               float32=fell_back["float32"])
    assert "Against the float32 computation (ours forward" in markdown([rec], w.cfg, {})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_engine_matches_reference(dtype):
    """On a GPU: the engine's CUDA graph (prefill inside) returns the CPU reference's beams (fp32),
    catalog items in decreasing score order (bf16)."""
    catalog = tiny_catalog()
    ids, mask = inputs()
    cpu = build_random(SHAPE, seed=3)[0]
    want = serving(cpu, build_index(catalog), 6).decode(ids, mask)
    # the same weights (CUDA's generator would draw others)
    run = serving(cpu.to("cuda", dtype), build_index(catalog, device="cuda"), 6)
    for _ in range(2):                       # the second call replays the captured graph
        got = run.decode(ids.cuda(), mask.cuda())
    assert run.prefill_in_graph
    rows, scores = got.item_rows.cpu(), got.scores.cpu()
    assert (rows >= 0).all() and (scores[:, :-1] >= scores[:, 1:]).all()
    assert np.array_equal(catalog.sids[rows.numpy()].astype(np.int64), got.tokens.cpu().numpy())
    if dtype == torch.float32:
        assert torch.equal(rows, want.item_rows)
        torch.testing.assert_close(scores, want.scores, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_range_check_after_the_launch():
    """On a GPU, ids on the GPU without a mask are range-checked after the graph's launch: a bad id
    raises the one-line error, the next replay returns the same items as the check before the launch."""
    import zerogr_core.models.qwen3 as qwen3

    catalog = tiny_catalog()
    ids = inputs(6)[0].cuda()
    model = build_random(SHAPE, seed=3)[0].to("cuda")
    index = build_index(catalog, device="cuda")
    run = serving(model, index, 6)
    first = [run.decode(ids) for _ in range(2)][-1]
    assert run.prefill_in_graph and not run.step_model._range.pending
    bad = ids.clone()
    bad[2, 3] = SHAPE.vocab
    with pytest.raises(ZeroGRError, match=r"^input_ids: row 2 has ids outside the model's vocabulary"):
        run.decode(bad)
    again = run.decode(ids)
    assert torch.equal(again.item_rows, first.item_rows)
    checked = serving(model, index, 6)
    original, qwen3.defers_range = qwen3.defers_range, lambda history, device: False
    try:
        want = checked.decode(ids)
    finally:
        qwen3.defers_range = original
    assert torch.equal(want.item_rows, first.item_rows)
