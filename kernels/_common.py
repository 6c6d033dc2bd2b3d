"""Helpers shared by the kernel modules: dispatch, argument checks, block sizes, launch options."""
from __future__ import annotations

import contextlib
import contextvars
import os

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """Return whether Triton runs in interpreter mode (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(*tensors: torch.Tensor) -> bool:
    """Return whether a public op should take its Triton path.

    True when the first tensor lives on a CUDA device, or when the interpreter is on
    (CPU tensors then run through the Triton interpreter). Otherwise the op uses its
    pure-PyTorch reference.
    """
    return tensors[0].is_cuda or interpreting()


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``max(n, 1)``."""
    return 1 << max(int(n) - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def check_tensor(name: str, t, *, dtypes, ndim: int, device: torch.device | None = None,
                 shape: tuple | None = None, contiguous: bool = False) -> None:
    """Raise ``TypeError`` / ``ValueError`` when ``t`` does not match the expectation.

    Parameters
    ----------
    name : str
        Argument name used in the message.
    t : torch.Tensor
        The argument.
    dtypes : tuple of torch.dtype
        Accepted dtypes.
    ndim : int
        Required number of dimensions.
    device : torch.device, optional
        Required device.
    shape : tuple, optional
        Required shape; ``None`` entries match any size.
    contiguous : bool
        Require a contiguous tensor.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if shape is not None and any(s is not None and s != ts for s, ts in zip(shape, t.shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_out(out, specs) -> None:
    """Check a preallocated ``out`` tuple against ``(name, shape, dtype, device)`` specs."""
    if len(out) != len(specs):
        raise ValueError(f"out must hold {len(specs)} tensors, got {len(out)}")
    for t, (name, shape, dtype, device) in zip(out, specs):
        check_tensor(f"out.{name}", t, dtypes=(dtype,), ndim=len(shape), device=device,
                     shape=shape, contiguous=True)


_CAPABILITY: dict = {}
_PDL_OFF = contextvars.ContextVar("zerogr_pdl_off", default=False)


@contextlib.contextmanager
def pdl_disabled(off: bool = True):
    """Within the block (when ``off``), this thread's launches go without PDL, whatever
    :func:`pdl_enabled` would say: a graph captured inside keeps its kernels without it."""
    token = _PDL_OFF.set(bool(off))
    try:
        yield
    finally:
        _PDL_OFF.reset(token)



def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with programmatic dependent launch (PDL).

    On Hopper and later (compute capability 9+) a kernel launched with PDL may be scheduled
    while the kernel before it in the stream is still finishing; its first instruction waits
    for that kernel's completion and memory (``griddepcontrol.wait``), so only the launch
    latency between the two overlaps, which is most of a small kernel's cost in a captured
    decode. ``ZEROGR_PDL=0`` turns it off; ``ZEROGR_PDL=force`` turns it on whatever the
    device (the offline compile test, which has none). Inside :func:`pdl_disabled`, off.
    """
    if _PDL_OFF.get():
        return False
    mode = os.environ.get("ZEROGR_PDL", "1")
    if mode == "force":
        return True
    if mode == "0" or device.type != "cuda" or interpreting():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITY[index][0] >= 9


def pdl_args(device: torch.device) -> dict:
    """Launch arguments of a kernel with a :func:`pdl_prologue`: its ``PDL`` constexpr and,
    when on, Triton's ``launch_pdl`` option."""
    on = pdl_enabled(device)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """First statement of every kernel the decode launches: under PDL, wait for the previous
    kernel's results, then let the next kernel be scheduled (it waits in turn)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def popcount32(x):
    """Set bits of each int64 lane of ``x``, which holds a value in [0, 2^32)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24) & 0xFF
