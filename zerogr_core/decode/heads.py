"""Output projections: per-level heads, or one shared head with a band per level."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from zerogr_kernels._common import FLOAT_DTYPES

from ..arg_types import whole_value, whole_values
from ..errors import ZeroGRError


@dataclass(frozen=True, eq=False)
class Heads:
    """The model's output projection, seen per level.

    Attributes
    ----------
    bands : tuple of torch.Tensor
        ``bands[l]`` has shape (|V_l|, H): the rows that score level l's tokens. For a
        shared head these are views into ``shared`` (never copies).
    shared : torch.Tensor or None, shape (rows, H)
        The whole head when the model has one shared head.
    band_offsets : tuple of int
        First row of each band in the shared head (0s for per-level heads).
    """

    bands: tuple[torch.Tensor, ...]
    shared: torch.Tensor | None
    band_offsets: tuple[int, ...]

    @classmethod
    def build(cls, heads, codebook_sizes: Sequence[int], band_offsets: Sequence[int] | None = None) -> "Heads":
        """Normalise the user's ``heads`` argument.

        Parameters
        ----------
        heads : list of torch.Tensor (|V_l|, H), or torch.Tensor (rows, H)
            Per-level heads, or one shared head.
        codebook_sizes : sequence of int
        band_offsets : sequence of int, optional
            For a shared head: first row of each level (default: cumulative codebook sizes).
            Whole numbers only; refused with per-level heads, which they cannot apply to.
        """
        sizes = tuple(int(s) for s in codebook_sizes)
        if isinstance(heads, Heads) and band_offsets is None:
            if tuple(h.shape[0] for h in heads.bands) != tuple(sizes):
                raise ZeroGRError(f"heads: built for codebooks {[h.shape[0] for h in heads.bands]}, "
                                  f"the index has {list(sizes)}")
            return heads
        if isinstance(heads, torch.Tensor):
            _check_dtype(heads, "heads")
            if heads.dim() != 2:
                raise ZeroGRError(f"heads: a shared head must be 2-D (rows, H), got shape {tuple(heads.shape)}")
            offsets = _whole_offsets(band_offsets) if band_offsets is not None else \
                tuple(int(sum(sizes[:l])) for l in range(len(sizes)))
            if len(offsets) != len(sizes):
                raise ZeroGRError(f"band_offsets: {len(offsets)} offsets for {len(sizes)} levels")
            for level, (o, s) in enumerate(zip(offsets, sizes)):
                if o < 0 or o + s > heads.shape[0]:
                    raise ZeroGRError(f"band_offsets: level {level + 1} band [{o}, {o + s}) exceeds the "
                                      f"head's {heads.shape[0]} rows")
            return cls(tuple(heads[o:o + s] for o, s in zip(offsets, sizes)), heads, offsets)
        if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
            raise ZeroGRError(f"heads: expected one (|V_l|, H) tensor per level or one shared (rows, H) tensor, "
                              f"got {type(heads).__name__}")
        if band_offsets is not None:
            # each per-level head starts at its own row 0: offsets given with them were silently dropped
            raise ZeroGRError("band_offsets: apply only to one shared (rows, H) head; heads is one head per "
                              "level, so leave band_offsets out")
        heads = list(heads)
        if len(heads) != len(sizes):
            raise ZeroGRError(f"heads: {len(heads)} per-level heads for {len(sizes)} levels")
        hidden = None
        for level, (w, s) in enumerate(zip(heads, sizes)):
            if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] != s:
                shape = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                raise ZeroGRError(f"heads[{level}]: expected shape ({s}, H), got {shape}")
            if hidden is not None and w.shape[1] != hidden:
                raise ZeroGRError(f"heads[{level}]: hidden size {w.shape[1]} differs from {hidden}")
            hidden = w.shape[1]
            _check_dtype(w, f"heads[{level}]")
            # the decoder reads one dtype and one device off heads[0] (hidden states are cast to
            # it, the index must sit beside it): another level's would fail deep in a kernel
            if w.dtype != heads[0].dtype or w.device != heads[0].device:
                raise ZeroGRError(f"heads[{level}]: {_dtype_name(w.dtype)} on {w.device}, but heads[0] is "
                                  f"{_dtype_name(heads[0].dtype)} on {heads[0].device} (one dtype and device "
                                  f"for every level)")
        return cls(tuple(heads), None, (0,) * len(sizes))

    @property
    def hidden_size(self) -> int:
        return int(self.bands[0].shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.bands[0].dtype

    @property
    def device(self) -> torch.device:
        return self.bands[0].device

    def band(self, level: int) -> tuple[torch.Tensor, int]:
        """Where level ``level``'s logits come from: (weight, row of the band's token 0).

        The shared head and the band's offset in it, or the level's own head and 0.
        """
        if self.shared is not None:
            return self.shared, self.band_offsets[level]
        return self.bands[level], 0

    def shape_key(self, batch: int, beam_width: int) -> tuple:
        """Key of a serving shape, under which plans are kept: (batch, beam, dtype, H)."""
        return (batch, beam_width, str(self.dtype).replace("torch.", ""), self.hidden_size)

    def normaliser(self, level: int) -> tuple[torch.Tensor, int]:
        """What scoring first projects at ``level``: (weight, row of the band's token 0).

        The whole shared head (as STATIC normalises), or the level's own head.
        """
        if self.shared is not None:
            return self.shared, self.band_offsets[level]
        return self.bands[level], 0


def _whole_offsets(band_offsets) -> tuple[int, ...]:
    """``band_offsets`` as ints, refusing what ``int()`` would have truncated (10.5 → 10) or misread."""
    if isinstance(band_offsets, (str, bytes)) or not hasattr(band_offsets, "__iter__"):
        raise ZeroGRError(f"band_offsets: expected one whole number per level, got {type(band_offsets).__name__}")
    out = []
    for level, o in enumerate(band_offsets):
        value = whole_value(o)
        if value is None:
            raise ZeroGRError(f"band_offsets: level {level + 1} offset {o!r} is not a whole number")
        out.append(int(value))
    return tuple(out)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_dtype(weight: torch.Tensor, name: str) -> None:
    """Refuse a head the projections cannot read (float64 from numpy, integers) in one line
    naming it, rather than as the kernels' complaint about the hidden states cast to it."""
    if weight.dtype not in FLOAT_DTYPES:
        raise ZeroGRError(f"{name}: dtype {_dtype_name(weight.dtype)}; heads must be float16, bfloat16 or "
                          f"float32 (e.g. .float())")


HIDDEN_STD = 2.0
"""Standard deviation of random hidden states: against :func:`random_heads` their logits
have a standard deviation of about 2 (a softmax neither flat nor one-hot)."""


def random_heads(codebook_sizes: Sequence[int], band_offsets: Sequence[int] | None, hidden_size: int,
                 dtype: torch.dtype = torch.float32, device="cpu",
                 generator: torch.Generator | None = None) -> Heads:
    """A random output projection in a catalog's layout, entries ~ N(0, 1/H).

    The one way heads are drawn without a trained model (the app, ``plan`` and ``bench``
    alike), so they all decode logits of the same magnitude.

    Parameters
    ----------
    codebook_sizes : sequence of int
    band_offsets : sequence of int or None
        One shared head with a band per level when given, else one head per level.
    hidden_size : int
    dtype : torch.dtype
    device : str or torch.device
        Where the heads end up.
    generator : torch.Generator, optional
        Drawn on the generator's device (so a CPU generator gives the same heads on every
        device), then moved to ``device``.
    """
    if hidden_size < 1:
        raise ZeroGRError(f"hidden size must be ≥ 1, got {hidden_size}")
    on = generator.device if generator is not None else torch.device("cpu")
    scale = 1.0 / math.sqrt(hidden_size)
    sizes = tuple(int(s) for s in codebook_sizes)

    def draw(rows: int) -> torch.Tensor:
        return (torch.randn(rows, hidden_size, generator=generator, device=on) * scale).to(dtype).to(device)

    if band_offsets is not None:
        return Heads.build(draw(max(o + s for o, s in zip(band_offsets, sizes))), sizes, band_offsets)
    return Heads.build([draw(s) for s in sizes], sizes)


def check_band_offsets(step_model, offsets, argument: str = "band_offsets") -> None:
    """Refuse a step model that feeds its tokens back at other ids than the heads score.

    A step model with ``token_offsets`` (the Hugging Face, T5 and Qwen3 adapters) feeds level
    ``l``'s chosen token ``t`` back as vocabulary id ``token_offsets[l] + t``; the shared head
    scores it at row ``offsets[l] + t``. Were they different, every step after the first would
    read another token than the one chosen, and the decode return other beams, silently.

    Parameters
    ----------
    step_model : StepModel
        Checked when it has ``token_offsets``; other step models feed their own tokens back.
    offsets : sequence of int
        First head row of each level.
    argument : str
        How the error names ``offsets``.

    Raises
    ------
    ZeroGRError
        One line naming both.
    """
    theirs = getattr(step_model, "token_offsets", None)
    if theirs is None:
        return
    # whole numbers compared as given: int() would read a step model's 3.7 as a matching 3
    fed = whole_values(theirs)
    if fed is None or fed != whole_values(offsets):
        raise ZeroGRError(f"step_model: its token_offsets {tuple(theirs)} differ from {argument} {tuple(offsets)}")
