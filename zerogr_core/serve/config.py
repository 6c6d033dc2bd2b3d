"""What a replica serves: model, catalog, beam width and planned batch sizes."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ZeroGRError
from ..decode.decoder import ENGINES
from .batching import batching_fields


@dataclass(frozen=True)
class ServeConfig:
    """Settings of a serving replica (and of ``decode-dataset``'s ranks).

    Attributes
    ----------
    checkpoint : str or None
        Recommender checkpoint (``train-movielens`` or ``train`` output); ``None``: the
        bundled MovieLens model (or ``$ZEROGR_MOVIELENS_CHECKPOINT``).
    catalog : str or None
        Catalog of the first version (a file or sample name, SIDs within the model's
        codebooks); ``None``: the checkpoint's own catalog.
    beam : int
        Beam width M; ``k`` of a request is at most M.
    batch_sizes : tuple of int
        The planned batch sizes, ascending. A gathered batch of n requests is padded to
        the smallest planned size ≥ n, so the engine only ever sees these shapes (planned
        and, on a GPU, captured at warm-up).
    batch_wait_s : float
        How long ``@serve.batch`` waits for a batch to fill.
    engine : str
        ``Decoder`` engine: auto (on CUDA the GPU engine, replaying one CUDA graph per
        planned size when the model has a KV-cache step model, eager otherwise; the
        reference path on CPU), reference, graph or eager.
    warmup : bool
        Decode every planned size once before a version is published (plans, compiles and
        captures off the request path).
    """

    checkpoint: str | None = None
    catalog: str | None = None
    beam: int = 32
    batch_sizes: tuple = (1, 2, 4, 8, 16)
    batch_wait_s: float = 0.005
    engine: str = "auto"
    warmup: bool = True

    def __post_init__(self):
        beam, sizes, wait = batching_fields(self.beam, self.batch_sizes, self.batch_wait_s)
        object.__setattr__(self, "beam", beam)
        object.__setattr__(self, "batch_sizes", sizes)
        object.__setattr__(self, "batch_wait_s", wait)
        if self.engine not in ENGINES:
            raise ZeroGRError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    @classmethod
    def preset(cls, name: str, **changes) -> "ServeConfig":
        """``"gpu"`` (beam 128, batches up to 64) or ``"cpu"`` (beam 32, batches up to 16)."""
        if name not in SERVE_PRESETS:
            raise ZeroGRError(f"unknown serve preset {name!r} (choose from {', '.join(SERVE_PRESETS)})")
        return replace(SERVE_PRESETS[name], **changes)

    def to_dict(self) -> dict:
        return dict(checkpoint=self.checkpoint, catalog=self.catalog, beam=self.beam,
                    batch_sizes=list(self.batch_sizes), batch_wait_s=self.batch_wait_s, engine=self.engine,
                    warmup=self.warmup)

    @classmethod
    def from_dict(cls, d: dict) -> "ServeConfig":
        return cls(**dict(d, batch_sizes=tuple(d["batch_sizes"])))


SERVE_PRESETS = {
    "cpu": ServeConfig(beam=32, batch_sizes=(1, 2, 4, 8, 16)),
    "gpu": ServeConfig(beam=128, batch_sizes=(1, 2, 4, 8, 16, 32, 64)),
}
