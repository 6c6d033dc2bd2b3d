"""T5's capturable prefill (``stage``: encoder and cross-attention inside the decode) against
the prefill outside the decode (Hugging Face's encoder), run eagerly on the CPU."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from zerogr_core import Catalog, build_index  # noqa: E402
from zerogr_core.errors import ZeroGRError  # noqa: E402
from zerogr_core.hf import HFGenerator  # noqa: E402
from zerogr_core.models.t5 import T5StepModel  # noqa: E402

SIZES = (16, 16, 8)
OFFSETS = (3, 19, 35)
VOCAB = 43


def catalog():
    rng = np.random.default_rng(0)
    sids = np.unique(np.stack([rng.integers(0, v, 600) for v in SIZES], axis=1), axis=0)
    return Catalog.from_sids(sids, SIZES)


def model(feed_forward="relu", dtype=torch.float32):
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                                   feed_forward_proj=feed_forward, dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(config).eval().to(dtype)


def padded(batch, t, seed, left=False):
    """Ids and a mask with every request of another length (one of them full, one a single token)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, t), generator=gen)
    lengths = torch.randint(1, t + 1, (batch,), generator=gen)
    lengths[0], lengths[-1] = t, 1
    pos = torch.arange(t)[None, :]
    mask = (pos >= t - lengths[:, None]) if left else (pos < lengths[:, None])
    return ids.masked_fill(~mask, 0), mask.long()


@pytest.mark.parametrize("feed_forward", ["relu", "gated-gelu"])
def test_encode_equals_hf_encoder(feed_forward):
    """The capturable encoder (bucket-padded) gives Hugging Face's memory on every real token."""
    m = model(feed_forward)
    step_model = T5StepModel(m, OFFSETS, history_bucket=8)
    ids, mask = padded(3, 11, seed=1)
    step_model.stage(ids, mask, beam_width=4)
    assert step_model.ids.shape == (3, 16)
    step_model.encode()
    with torch.no_grad():
        want = m.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(step_model.memory[:, :11][real], want[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("left", [False, True])
def test_staged_prefill_gives_the_beams_of_the_prefill_outside(left):
    """Same items and tokens, scores within FP32 rounding, for padded histories of different
    lengths in one batch; new requests of the same bucket reuse the static buffers."""
    index, m = build_index(catalog()), model()
    outside = HFGenerator(m, index, beam_width=12, token_offsets=OFFSETS,
                          step_model=T5StepModel(m, OFFSETS), prefill="outside")
    inside = HFGenerator(m, index, beam_width=12, token_offsets=OFFSETS,
                         step_model=T5StepModel(m, OFFSETS, history_bucket=8), prefill="inside")
    assert inside.serving.stage and not outside.serving.stage
    buffers = None
    for seed, t in ((0, 13), (1, 13), (2, 10), (3, 5)):
        ids, mask = padded(4, t, seed, left)
        want, got = outside.generate(ids, mask), inside.generate(ids, mask)
        assert torch.equal(got.item_rows, want.item_rows), (seed, t)
        assert torch.equal(got.tokens, want.tokens), (seed, t)
        torch.testing.assert_close(got.scores, want.scores, rtol=1e-5, atol=1e-5)
        assert (got.item_rows >= 0).all()
        sm = inside.step_model
        assert sm.encode_in_step and sm._static_key[1] == sm.bucket(t)
        if t in (13, 10):                                   # one bucket (16): the same static tensors
            if buffers is not None:
                assert sm.ids is buffers[0] and sm.cross_kv is buffers[1]
            buffers = (sm.ids, sm.cross_kv)
        else:
            assert sm.ids is not buffers[0] and sm.ids.shape == (4, 8)


def test_switching_between_the_two_prefills():
    """One step model served both ways in turn gives the same beams each time."""
    index, m = build_index(catalog()), model()
    step_model = T5StepModel(m, OFFSETS)
    a = HFGenerator(m, index, beam_width=6, token_offsets=OFFSETS, step_model=step_model, prefill="inside")
    b = HFGenerator(m, index, beam_width=6, token_offsets=OFFSETS, step_model=step_model, prefill="outside")
    ids, mask = padded(2, 9, seed=4)
    first = a.generate(ids, mask)
    second = b.generate(ids, mask)
    assert not step_model.encode_in_step
    third = a.generate(ids, mask)
    assert torch.equal(first.item_rows, second.item_rows) and torch.equal(first.item_rows, third.item_rows)
    torch.testing.assert_close(first.scores, third.scores, rtol=0, atol=0)


def test_staged_loop_serving_equals_prefill_outside():
    """The bench's loop methods stage the same way and decode the same beams."""
    from zerogr_core.bench.e2e import LoopServing
    from zerogr_core.bench.methods import UnconstrainedStep
    from zerogr_core.decode.heads import Heads

    m = model()
    heads = Heads.build(m.lm_head.weight.detach(), SIZES, OFFSETS)
    ids, mask = padded(3, 7, seed=5)
    out = []
    for stage in (False, True):
        serving = LoopServing(T5StepModel(m, OFFSETS), lambda b: UnconstrainedStep(heads, b, 8), len(SIZES), 8,
                              heads.hidden_size, heads.dtype, torch.device("cpu"), stage=stage)
        out.append(serving.decode(ids, mask))
    assert torch.equal(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-5, atol=1e-5)


def test_staged_loop_serving_checks_deferred_ids(monkeypatch):
    """The bench's loop methods read a range check the model deferred past the launch, as StepDecoder
    does (here forced on the CPU): a bad id raises the one-line error, the next decode is unharmed."""
    from zerogr_core.bench.e2e import LoopServing
    from zerogr_core.bench.methods import UnconstrainedStep
    from zerogr_core.decode.heads import Heads
    from zerogr_core.models import t5

    m = model()
    heads = Heads.build(m.lm_head.weight.detach(), SIZES, OFFSETS)
    ids, mask = padded(3, 7, seed=5)
    serving = LoopServing(T5StepModel(m, OFFSETS), lambda b: UnconstrainedStep(heads, b, 8), len(SIZES), 8,
                          heads.hidden_size, heads.dtype, torch.device("cpu"), stage=True)
    want = serving.decode(ids, mask)
    monkeypatch.setattr(t5, "defers_range", lambda history, device: True)
    bad = ids.clone()
    bad[2, 0] = VOCAB
    with pytest.raises(ZeroGRError, match=rf"^input_ids: row 2 has ids outside the model's vocabulary \[0, {VOCAB}\)$"):
        serving.decode(bad, mask)
    got = serving.decode(ids, mask)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_prefill_option_errors():
    from zerogr_core.hf import HFStepModel

    index, m = build_index(catalog()), model()
    with pytest.raises(ZeroGRError, match="prefill must be one of"):
        HFGenerator(m, index, beam_width=4, token_offsets=OFFSETS, prefill="later")
    with pytest.raises(ZeroGRError, match="has no stage"):
        HFGenerator(m, index, beam_width=4, token_offsets=OFFSETS, step_model=HFStepModel(m, OFFSETS),
                    prefill="inside")
    with pytest.raises(ZeroGRError, match="history_bucket"):
        T5StepModel(m, OFFSETS, history_bucket=0)
    with pytest.raises(ZeroGRError, match="attention_mask: shape"):
        T5StepModel(m, OFFSETS).stage(torch.ones(2, 4, dtype=torch.long), torch.ones(2, 5), beam_width=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_staged_decode_reads_no_tensor_value_on_the_host(dtype):
    """On the meta device (shapes only, no values) every op that would synchronise with the
    host (``.item()``, ``bool(tensor)``, data-dependent shapes) fails: the staged prefill and
    the steps run there, so they can be captured; Hugging Face's own encoder cannot."""
    config = model().config
    with torch.device("meta"):
        meta = transformers.T5ForConditionalGeneration(config).eval().to(dtype)
    step_model = T5StepModel(meta, OFFSETS)
    ids = torch.zeros(2, 9, dtype=torch.int64, device="meta")
    step_model.stage(ids, torch.ones_like(ids), beam_width=4)
    assert step_model.step(0, None, None).shape == (2, 32)
    tokens = torch.zeros(2, 4, dtype=torch.int32, device="meta")
    parents = torch.zeros(2, 4, dtype=torch.int64, device="meta")
    for level in (1, 2):
        assert step_model.step(level, tokens, parents).shape == (8, 32)
    with pytest.raises(RuntimeError, match="meta"):
        step_model.prefill(ids, torch.ones_like(ids), beam_width=4)


@pytest.mark.parametrize("feed_forward,dtype", [("relu", torch.float32), ("relu", torch.bfloat16),
                                                ("gated-gelu", torch.float32)])
def test_fused_feed_forward_equals_hugging_face(feed_forward, dtype):
    """The GEMM + ReLU epilogue path (taken on CUDA) forced on the CPU: Hugging Face's feed-forward
    module's output; a gated one falls back to the module itself."""
    m = model(feed_forward, dtype)
    step_model = T5StepModel(m, OFFSETS)
    step_model.stage(torch.ones(2, 4, dtype=torch.long), beam_width=2)
    dense = m.decoder.block[0].layer[2].DenseReluDense
    h = torch.randn(2, 5, 32).to(dtype)
    with torch.no_grad():
        want = dense(h)
        calls = []
        hook = dense.register_forward_hook(lambda *args: calls.append(1))
        try:
            got = step_model._feed_forward(dense, h, fused=True)
        finally:
            hook.remove()
    assert len(calls) == (feed_forward != "relu")
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.skipif(not (torch.cuda.is_available() or __import__("os").environ.get("TRITON_INTERPRET") == "1"),
                    reason="the Triton kernels need a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("feed_forward,dtype,staged", [("relu", torch.float32, True), ("relu", torch.float32, False),
                                                       ("gated-gelu", torch.float32, True),
                                                       ("relu", torch.bfloat16, True)])
def test_kernel_path_equals_hugging_face_cache(feed_forward, dtype, staged):
    """The path CUDA tensors take (Triton kernels, fused GEMM + ReLU), on the GPU when there is
    one, else forced on the CPU through the interpreter: every step's output equals Hugging
    Face's own decoder with its cache."""
    from zerogr_core.hf import HFStepModel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = model(feed_forward, dtype).to(device)
    ids, mask = (t.to(device) for t in padded(3, 11, seed=4))
    beam = 5
    ours, theirs = T5StepModel(m, OFFSETS, history_bucket=8), HFStepModel(m, OFFSETS)
    ours.kernels = True
    (ours.stage if staged else ours.prefill)(ids, mask, beam_width=beam)
    theirs.prefill(ids, mask, beam_width=beam)
    # float32: 1e-5 as the CPU tests, 1e-4 on a GPU as the GPU suite (cuBLAS picks other algorithms)
    tol = (1e-5 if device == "cpu" else 1e-4) if dtype == torch.float32 else 3e-2
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        torch.testing.assert_close(ours.step(0, None, None), theirs.step(0, None, None), rtol=tol, atol=tol)
        prev = 1
        for step in range(1, len(OFFSETS)):
            parents = torch.arange(3)[:, None] * prev + torch.randint(0, prev, (3, beam), generator=gen)
            tokens = torch.randint(0, SIZES[step - 1], (3, beam), generator=gen).int()
            torch.testing.assert_close(ours.step(step, tokens.to(device), parents.to(device)),
                                       theirs.step(step, tokens.to(device), parents.to(device)), rtol=tol, atol=tol)
            prev = beam
