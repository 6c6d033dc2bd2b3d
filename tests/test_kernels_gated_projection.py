"""The gate/up GEMM with SwiGLU's gate in its epilogue against the unfused ops, and the Qwen3 switch."""
import math

import pytest
import torch
from kernel_asserts import assert_kernel_equal, kernel_device

from zerogr_kernels.gated_projection import (SMEM_BYTES, TILINGS, GateUpTiling, _fit, choose_tiling, gate_up_silu,
                                             gate_up_silu_reference, gate_up_silu_triton)

DEV = kernel_device()
# On a GPU the kernel rounds as the unfused ops round (libdevice's exp, rounded division, no
# contraction), so where its GEMM is exact it returns their bits. The Triton interpreter truncates
# float32 to bfloat16 where the GPU rounds to nearest: bfloat16 bits are a GPU-only check.
EXACT = torch.cuda.is_available()

ULP = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
"""Spacing of the dtype's numbers relative to their size, at most: one rounding (to nearest, or the
interpreter's truncation) moves a value by at most this fraction of it."""
TINY = {torch.float32: 2.0 ** -149, torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133}
"""The dtype's smallest subnormal: a rounding into the subnormal range may move a value by this much."""
F32 = 2.0 ** -24   # float32's unit roundoff

# edge tilings: every tile edge masked (n, F, H below the blocks), several programs in both dims with
# a partial last group (GROUP_M 2 or 3 over an odd number of row blocks), no grouping, an even hidden loop
TILES = {
    "16x16x16g2": GateUpTiling(16, 16, 16, group_m=2),
    "32x16x32g3": GateUpTiling(32, 16, 32, group_m=3, num_warps=4, num_stages=2),
    "16x32x16g1": GateUpTiling(16, 32, 16, group_m=1),
    "small": TILINGS["small"],
    "large": TILINGS["large"],
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SIZES = [(n, h, f) for n in (1, 3, 17, 130) for h in (8, 40, 72) for f in (5, 16, 33)]


def random_inputs(n, h, f, dtype, seed=0):
    """x (n, h) standard normal; weight (2 f, h) scaled so each projection has standard deviation 2
    (the SiLU's saturated negative side, its bend and its linear side all occur)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g)
    w = torch.randn(2 * f, h, generator=g) * (2 / math.sqrt(h))
    return x.to(dtype).to(DEV), w.to(dtype).to(DEV)


def exact_inputs(n, h, f, dtype, seed=0):
    """Inputs whose float32 GEMM is exact in any summation order: x = i / 64 (|i| <= 64), w = j / 256
    (|j| <= 128), exact in every dtype; each product is a multiple of 2^-14 below 1/2, so a sum of
    h <= 1,000 of them needs at most 23 bits. The projections (about 1.4 standard deviations at h = 72)
    still carry more bits than a half-precision number, so their roundings are exercised."""
    assert h <= 1000
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-64, 65, (n, h), generator=g) / 64
    w = torch.randint(-128, 129, (2 * f, h), generator=g) / 256
    return x.to(dtype).to(DEV), w.to(dtype).to(DEV)


def truth_and_bound(x, w):
    """``silu(G) * U`` in float64 from the same (rounded) inputs, and a per-element bound on how far
    any computation with the kernel's roundings may lie from it.

    The kernel (and the unfused ops) compute ``r(r(silu32(g)) * u)`` with ``g = r(G + a_g)``,
    ``u = r(U + a_u)``: ``r`` a rounding to the dtype (relative error at most ``ULP``, plus ``TINY``
    near zero), ``a`` the float32 GEMM's error in some summation order (at most
    ``h · 2^-24 · sum |x_k w_k|``), ``silu32`` float32's SiLU (a few float32 roundings, ``4 · 2^-24``
    relative). Carried through: ``|g - G| <= dg``, ``|u - U| <= du``; the SiLU moves by at most
    ``(|silu'(G)| + dg / 2) · dg`` (``|silu''| <= 1/2``), then its own rounding; the product adds
    ``|silu(G)| du`` and ``|U| ds`` and one rounding. This is a few units in the last place of each
    rounded value, not a loose multiple: the unfused reference uses about a third of it in
    bfloat16 and the interpreter's truncating kernel about three quarters (test below).
    """
    xd, wd = x.cpu().double(), w.cpu().double()
    h, f = x.shape[1], w.shape[0] // 2
    eps, tiny = ULP[x.dtype], TINY[x.dtype]
    big, small = xd @ wd.T, xd.abs() @ wd.abs().T
    G, U = big[:, :f], big[:, f:]
    ag, au = h * F32 * small[:, :f], h * F32 * small[:, f:]
    dg = ag + eps * (G.abs() + ag) + tiny
    du = au + eps * (U.abs() + au) + tiny
    sig = torch.sigmoid(G)
    silu = G * sig
    slope = (sig * (1 + G * (1 - sig))).abs() + dg / 2
    ds = slope * dg + (eps + 4 * F32) * (silu.abs() + slope * dg) + tiny
    prod = ds * (U.abs() + du) + silu.abs() * du
    return silu * U, prod + (eps + F32) * (silu.abs() * U.abs() + prod) + tiny


def assert_within(got, truth, bound, name, max_show=8):
    """|got - truth| <= bound element by element; the first mismatches listed on failure."""
    got = got.cpu().double()
    err = (got - truth).abs()
    bad = ~(err <= bound)  # NaN fails too
    if bad.any():
        idx = bad.nonzero()
        lines = [f"{name}: {idx.shape[0]} of {bad.numel()} elements outside the rounding bound; first:"]
        for r, c in idx[:max_show].tolist():
            lines.append(f"  at ({r}, {c}): got {got[r, c].item()!r}, exact {truth[r, c].item()!r}, "
                         f"error {err[r, c].item():.3g} > bound {bound[r, c].item():.3g}")
        raise AssertionError("\n".join(lines))


def check(x, w, tiling, name):
    got = gate_up_silu_triton(x, w, tiling)
    n, f = x.shape[0], w.shape[0] // 2
    assert got.shape == (n, f) and got.dtype == x.dtype and got.is_contiguous() and got.device == x.device
    truth, bound = truth_and_bound(x, w)
    ref = gate_up_silu_reference(x, w)
    # the bound must hold for the unfused ops themselves, or it is not the bound it claims to be
    assert_within(ref, truth, bound, f"{name} (reference)")
    assert_within(got, truth, bound, name)
    if x.dtype == torch.float32:
        # float32: the roundings are float32's, so only the summation order differs
        assert_kernel_equal(got, ref, name=name, rtol=1e-5, atol=1e-5)
    return got, ref


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,h,f", SIZES)
def test_odd_sizes_within_rounding_bound(n, h, f, dtype):
    check(*random_inputs(n, h, f, dtype, seed=n * h + f), TILES["16x16x16g2"], f"{n}x{h}x{f}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tile", list(TILES))
@pytest.mark.parametrize("n,h,f", [(130, 72, 33), (17, 64, 16), (3, 8, 5)])
def test_tilings_within_rounding_bound(n, h, f, tile, dtype):
    """Every tiling, including the presets (whose blocks exceed these sizes on every edge) and a
    hidden size that the K step divides (the unmasked loop)."""
    check(*random_inputs(n, h, f, dtype, seed=7), TILES[tile], f"{tile} {n}x{h}x{f}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tile", ["16x16x16g2", "32x16x32g3", "small"])
@pytest.mark.parametrize("n,h,f", [(130, 72, 33), (17, 40, 16)])
def test_exact_products_round_as_the_unfused_ops(n, h, f, tile, dtype, monkeypatch):
    """With an exact GEMM the epilogue alone decides the bits: each projection rounded to the dtype,
    the SiLU rounded, the product rounded, as ``F.linear`` then ``silu_mul`` round them.

    A GPU returns the reference's bits. The interpreter rounds float16 to nearest too, but its SiLU
    uses numpy's float32 exp, not torch's: a rare float16 SiLU may round one unit apart there
    (float32 outputs then differ in the last bits, so the interpreter checks float16 only)."""
    if not EXACT and dtype != torch.float16:
        pytest.skip("bit checks of bfloat16 and float32 need a GPU (the interpreter truncates bfloat16, "
                    "and its exp is numpy's)")
    if EXACT:  # cuBLAS may add split-K partial sums in half precision unless told not to
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", False)
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False)
    x, w = exact_inputs(n, h, f, dtype, seed=n + f)
    exact = x.cpu().double() @ w.cpu().double().T
    assert torch.equal(exact, (x.cpu().float() @ w.cpu().float().T).double()), "the inputs' GEMM is not exact"
    got, ref = gate_up_silu_triton(x, w, TILES[tile]), gate_up_silu_reference(x, w)
    name = f"{tile} {n}x{h}x{f}"
    if EXACT or (got == ref).float().mean().item() < 0.99:
        # a GPU: every bit; the interpreter: a rounding step left out or misplaced moves a quarter or
        # more of the outputs, an exp a unit apart far fewer (the failure lists the first)
        assert_kernel_equal(got, ref, name=name, rtol=0.0, atol=0.0)
    assert_within(got, ref.cpu().double(), ULP[dtype] * ref.cpu().double().abs() + TINY[dtype], name)


def test_zero_rows_and_empty_hidden():
    x, w = random_inputs(0, 40, 16, torch.bfloat16)
    out = gate_up_silu(x, w)
    assert out.shape == (0, 16) and out.dtype == torch.bfloat16
    out = gate_up_silu_triton(torch.zeros(3, 0, device=DEV), torch.zeros(10, 0, device=DEV))
    assert out.shape == (3, 5) and torch.equal(out, torch.zeros(3, 5, device=DEV))


def test_public_op_dispatches(monkeypatch):
    """Triton for CUDA tensors or under the interpreter, else the reference."""
    x, w = random_inputs(5, 40, 16, torch.float32)
    assert torch.equal(gate_up_silu(x, w), gate_up_silu_triton(x, w))
    if DEV == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert torch.equal(gate_up_silu(x, w), gate_up_silu_reference(x, w))


def _bad_inputs():
    x, w = random_inputs(4, 8, 5, torch.float32)
    return {
        "dtype mix": (x, w.half(), r"^weight: dtype float16 differs from x's float32$"),
        "1-D x": (x[0], w, r"^x must be 2-D"),
        "3-D weight": (x, w[None], r"^weight must be 2-D"),
        "odd weight rows": (x, w[:9], r"^weight: expected an even, positive number of rows"),
        "no weight rows": (x, w[:0], r"^weight: expected an even, positive number of rows"),
        "hidden mismatch": (x, w[:, :7].contiguous(), r"^weight: expected 8 columns \(x's hidden size\), got 7$"),
        "strided x": (torch.randn(8, 4).t(), w, r"^x must be contiguous$"),
        "strided weight": (x, torch.randn(8, 10).t(), r"^weight must be contiguous$"),
        "weight elsewhere": (x, w.to("meta"), r"^weight is on meta"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
@pytest.mark.parametrize("fn", [gate_up_silu_triton, gate_up_silu_reference], ids=["triton", "reference"])
def test_rejects_bad_inputs(case, fn):
    x, w, match = _bad_inputs()[case]
    if DEV == "cuda" and case != "weight elsewhere":
        x, w = x.cuda(), w.cuda()
    with pytest.raises(ValueError, match=match) as info:
        fn(x, w)
    assert "\n" not in str(info.value)


def test_rejects_bad_dtypes_and_tilings():
    x, w = random_inputs(4, 16, 16, torch.float32)
    with pytest.raises(TypeError, match=r"^x must have dtype in \(float16, bfloat16, float32\), got int64$"):
        gate_up_silu_triton(x.long(), w)
    with pytest.raises(ValueError, match=r"^tiling: block_m must be a power of two >= 16, got 24$"):
        GateUpTiling(24, 16, 16)
    with pytest.raises(ValueError, match=r"^tiling: block_k must be a power of two >= 16, got 8$"):
        GateUpTiling(16, 16, 8)
    with pytest.raises(ValueError, match=r"^tiling: num_stages must be a positive integer, got 0$"):
        GateUpTiling(16, 16, 16, num_stages=0)
    with pytest.raises(ValueError, match=r"^tiling: expected a GateUpTiling or None, got tuple$"):
        gate_up_silu_triton(x, w, (16, 16, 16))


def test_tile_choice_and_shared_memory():
    assert choose_tiling(1) is choose_tiling(512) is TILINGS["small"]
    assert choose_tiling(513) is choose_tiling(40_000) is TILINGS["large"]
    for t in TILINGS.values():
        # half-precision operands: the presets' pipelines fit as given; float32 ones lose stages
        assert _fit(t, 2) is t and t.smem_bytes(2) <= SMEM_BYTES
        fitted = _fit(t, 4)
        assert 1 <= fitted.num_stages < t.num_stages and fitted.smem_bytes(4) <= SMEM_BYTES
        assert fitted.smem_bytes(4) + fitted.smem_bytes(4) // fitted.num_stages > SMEM_BYTES
    assert str(TILINGS["large"]) == "128x128x64 g8 w8 s4"


# ---- the Qwen3 switch ---------------------------------------------------------------------------

def test_qwen3_fused_gate_gives_the_cublas_paths_outputs(monkeypatch):
    """``qwen3.GATED_PROJECTION = "fused"`` on the tiny float32 model: per-step hidden states and a
    whole decode as the default path gives them, within float32's summation-order differences; with
    ``GATED_MIN_ROWS`` only the calls of that many rows or more take the kernel."""
    pytest.importorskip("transformers")
    from test_qwen3 import OFFSETS, SHAPE, inputs, serving, tiny_catalog

    from zerogr_core import build_index
    from zerogr_core.models import qwen3
    from zerogr_core.models.qwen3 import Qwen3StepModel, build_random

    model = build_random(SHAPE, seed=3)[0]
    rows = []

    def spy(h, weight):
        rows.append(h.shape[0])
        return gate_up_silu(h, weight)

    monkeypatch.setattr(qwen3, "gate_up_silu", spy)
    ids, mask = inputs()
    b, beam = ids.shape[0], 4
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, SHAPE.codebook_sizes[0], (b, beam), generator=gen).int()
    parents = torch.arange(b)[:, None] + torch.zeros(b, beam, dtype=torch.int64)   # each request's one beam

    def hidden_states():
        sm = Qwen3StepModel(model, OFFSETS, context_bucket=8)
        sm.prefill(ids, mask, beam_width=beam)
        return sm.step(0, None, None).clone(), sm.step(1, tokens, parents).clone()

    index = build_index(tiny_catalog())
    want = hidden_states(), serving(model, index, 6).decode(ids, mask)
    assert rows == []                                  # the default never calls the kernel
    monkeypatch.setattr(qwen3, "GATED_PROJECTION", "fused")
    got = hidden_states(), serving(model, index, 6).decode(ids, mask)
    assert rows and min(rows) < 20 <= max(rows)        # prefills (48 rows a layer) and decode steps
    for g, e, name in zip(got[0], want[0], ("step 0", "step 1")):
        assert_kernel_equal(g, e, name=name, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1].item_rows, want[1].item_rows)
    torch.testing.assert_close(got[1].scores, want[1].scores, rtol=1e-5, atol=1e-5)

    rows.clear()
    monkeypatch.setattr(qwen3, "GATED_MIN_ROWS", 20)
    hidden_states()
    assert rows and min(rows) >= 20                    # the small calls kept cuBLAS

    monkeypatch.setattr(qwen3, "GATED_PROJECTION", "triton")
    with pytest.raises(qwen3.ZeroGRError, match="GATED_PROJECTION: expected 'cublas' or 'fused', got 'triton'"):
        hidden_states()
