"""Bounds on what a catalog load may read and decode.

:func:`zerogr_core.catalog.io.load_catalog` checks a :class:`LoadLimits` before it
materialises a file: the size on disk, the row count (Parquet metadata or a lazy CSV
count) and the decoded size (Parquet column chunks, then the string columns as read), so
that a file over a limit, or a small file that decodes to gigabytes, is refused with a
one-line error instead of exhausting the server's memory. The CLI passes no limits.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..errors import ZeroGRError

MB = 2**20


@dataclass(frozen=True)
class LoadLimits:
    """Largest catalog file a load accepts.

    Attributes
    ----------
    max_rows : int
        Data rows (items) per file.
    max_file_bytes : int
        Bytes on disk (server files; uploads have their own, smaller, upload limit).
    max_decoded_bytes : int
        Bytes once decoded: Parquet's uncompressed column data and the decoded string
        columns (titles, ``sid`` strings); a CSV decodes to about its size on disk.
    """

    max_rows: int = 20_000_000
    max_file_bytes: int = 2048 * MB
    max_decoded_bytes: int = 4096 * MB

    def __post_init__(self):
        for name in ("max_rows", "max_file_bytes", "max_decoded_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ZeroGRError(f"load limit {name} must be a positive whole number, got {value!r}")

    def describe(self) -> str:
        """One line for the page: ``"up to 20,000,000 rows and 4,096 MB decoded, 2,048 MB on disk"``."""
        return (f"up to {self.max_rows:,} rows and {self.max_decoded_bytes / MB:,.0f} MB decoded, "
                f"{self.max_file_bytes / MB:,.0f} MB on disk")


#: Named presets: ``workstation`` (the default, a GPU box with tens of GB of host memory),
#: ``shared`` (a small or crowded host) and ``large`` (10^8-item catalogs on a big host).
LIMIT_PRESETS: dict[str, LoadLimits] = {
    "workstation": LoadLimits(),
    "shared": LoadLimits(max_rows=2_000_000, max_file_bytes=256 * MB, max_decoded_bytes=512 * MB),
    "large": LoadLimits(max_rows=200_000_000, max_file_bytes=16384 * MB, max_decoded_bytes=32768 * MB),
}

#: Environment variables: a preset name, then per-field overrides (rows; MB).
ENV_PRESET = "ZEROGR_LIMITS"
ENV_FIELDS = {"ZEROGR_MAX_ROWS": ("max_rows", 1), "ZEROGR_MAX_FILE_MB": ("max_file_bytes", MB),
              "ZEROGR_MAX_DECODED_MB": ("max_decoded_bytes", MB)}


def limits_from(preset: str | None = None, overrides: dict | None = None,
                environ: dict | None = None) -> LoadLimits:
    """The limits in force: a preset, then ``overrides`` (config file), then the environment.

    Parameters
    ----------
    preset : str, optional
        A :data:`LIMIT_PRESETS` name (default ``workstation``); ``ZEROGR_LIMITS`` wins.
    overrides : dict, optional
        Field name → value (``max_rows`` in rows, the byte fields in bytes).
    environ : mapping, optional
        Default ``os.environ``; ``ZEROGR_MAX_ROWS``, ``ZEROGR_MAX_FILE_MB`` and
        ``ZEROGR_MAX_DECODED_MB`` override single fields.

    Raises
    ------
    ZeroGRError
        Unknown preset or field, or a value that is not a positive number.
    """
    environ = os.environ if environ is None else environ
    name = environ.get(ENV_PRESET) or preset or "workstation"
    if name not in LIMIT_PRESETS:
        raise ZeroGRError(f"{ENV_PRESET if environ.get(ENV_PRESET) else 'limits preset'}: unknown preset "
                          f"{name!r}; choose one of {', '.join(LIMIT_PRESETS)}")
    fields = dict(overrides or {})
    unknown = set(fields) - {"max_rows", "max_file_bytes", "max_decoded_bytes"}
    if unknown:
        raise ZeroGRError(f"unknown load limit {sorted(unknown)[0]!r}; use max_rows, max_file_bytes or "
                          f"max_decoded_bytes")
    for var, (field, unit) in ENV_FIELDS.items():
        text = environ.get(var)
        if text:
            try:
                fields[field] = int(float(text) * unit)
            except ValueError:
                raise ZeroGRError(f"{var}={text!r} is not a number") from None
    return replace(LIMIT_PRESETS[name], **fields)
