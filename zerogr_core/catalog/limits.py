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
from pathlib import Path

from ..errors import CatalogError, ZeroGRError, first_line, shown

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
    max_levels : int
        SID length L. Every level is one decode step with its own index slice, plan entry
        and chart, so a file with thousands of level columns would run thousands of steps.
    max_codebook : int
        Tokens per level |V_l| (declared, or the largest token + 1). The index keeps a
        dense row of |V_l| slots for every prefix of a dense step, and scoring first a
        logit per token, so one huge token id would cost memory for every prefix.
    """

    max_rows: int = 20_000_000
    max_file_bytes: int = 2048 * MB
    max_decoded_bytes: int = 4096 * MB
    max_levels: int = 16
    max_codebook: int = 65_536

    def __post_init__(self):
        for name in LIMIT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ZeroGRError(f"load limit {name} must be a positive whole number, got {value!r}")

    def describe(self) -> str:
        """One line for the page: ``"up to 20,000,000 rows and 4,096 MB decoded, 2,048 MB on disk"``."""
        return (f"up to {self.max_rows:,} rows and {self.max_decoded_bytes / MB:,.0f} MB decoded, "
                f"{self.max_file_bytes / MB:,.0f} MB on disk, {self.max_levels} levels and "
                f"{self.max_codebook:,} tokens per level")

    def check_shape(self, n_levels: int, codebook_sizes, source: str) -> None:
        """Refuse a SID layout over :attr:`max_levels` or :attr:`max_codebook`, with the reason.

        Parameters
        ----------
        n_levels : int
            SID length L of the file.
        codebook_sizes : sequence of int, or None
            |V_l| per level, declared or inferred (``None``: not known yet).
        source : str
            File name for messages.

        Raises
        ------
        CatalogError
        """
        if n_levels > self.max_levels:
            raise CatalogError(f"{n_levels:,} SID levels, over the limit of {self.max_levels} (each level is "
                               f"one decode step; real semantic IDs have 3–8)", source=source)
        for level, size in enumerate(codebook_sizes or (), start=1):
            if size > self.max_codebook:
                raise CatalogError(f"level {level} has a codebook of {size:,} tokens, over the limit of "
                                   f"{self.max_codebook:,} (the index keeps a slot per token for every "
                                   f"prefix)", source=source)


#: The fields of :class:`LoadLimits`, in order.
LIMIT_FIELDS = ("max_rows", "max_file_bytes", "max_decoded_bytes", "max_levels", "max_codebook")


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
              "ZEROGR_MAX_DECODED_MB": ("max_decoded_bytes", MB), "ZEROGR_MAX_LEVELS": ("max_levels", 1),
              "ZEROGR_MAX_CODEBOOK": ("max_codebook", 1)}


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
        ``ZEROGR_MAX_DECODED_MB``, ``ZEROGR_MAX_LEVELS`` and ``ZEROGR_MAX_CODEBOOK``
        override single fields.

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
    unknown = set(fields) - set(LIMIT_FIELDS)
    if unknown:
        raise ZeroGRError(f"unknown load limit {sorted(unknown)[0]!r}; use one of {', '.join(LIMIT_FIELDS)}")
    for var, (field, unit) in ENV_FIELDS.items():
        text = environ.get(var)
        if text:
            try:
                fields[field] = int(float(text) * unit)
            except ValueError:
                raise ZeroGRError(f"{var}={text!r} is not a number") from None
    return replace(LIMIT_PRESETS[name], **fields)


# ---------------------------------------------------------------------------- checks
# Polars and pyarrow are imported inside the checks: this module is imported by the app's
# settings code, and the GPU path must not need either.
def check_extent(path: Path, fmt: str, separator: str | None, limits: LoadLimits, source: str) -> None:
    """Refuse a file over ``limits`` from its size, its Parquet footer or a lazy CSV row count.

    Nothing is materialised: a file this refuses is never decoded.

    Parameters
    ----------
    path : Path
    fmt : {"csv", "tsv", "parquet"}
    separator : str or None
        The field separator of a CSV/TSV file.
    limits : LoadLimits
    source : str
        File name for messages.

    Raises
    ------
    CatalogError
        Over the size on disk, the row limit or the decoded size.
    """
    size = path.stat().st_size
    if size > limits.max_file_bytes:
        raise CatalogError(f"file is {size / MB:,.1f} MB, over the limit of {limits.max_file_bytes / MB:,.0f} MB "
                           f"on disk", source=source)
    if fmt == "parquet":
        rows, decoded = parquet_extent(path, source)
    else:
        import polars as pl

        # Polars' lazy scanner counts rows (quote-aware) without building the frame.
        try:
            rows = pl.scan_csv(path, separator=separator, infer_schema=False).select(pl.len()).collect().item()
        except pl.exceptions.PolarsError:
            rows = 0  # unreadable: the full read reports why
        decoded = size  # text decodes to about its own size
    _check_counts(rows, decoded, limits, source)


def parquet_extent(path: Path, source: str) -> tuple[int, int]:
    """Rows and a lower bound of the decoded bytes of a Parquet file, from its footer alone.

    A column chunk decodes to at least its uncompressed page bytes, and to at least its
    value count times the value width: run-length and dictionary encodings shrink pages
    far below that, which is what a decompression bomb relies on.

    Returns
    -------
    (int, int)
        Rows, decoded bytes.

    Raises
    ------
    CatalogError
        Not a Parquet file (the reader's reason, withheld while values are redacted).
    """
    import pyarrow
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
    except (pyarrow.ArrowException, OSError) as err:
        reason = first_line(err, type(err).__name__)
        raise CatalogError(f"cannot read as PARQUET: {shown(reason, quote=False)}", source=source) from None
    decoded = 0
    for group in range(meta.num_row_groups):
        chunks = meta.row_group(group)
        for column in range(chunks.num_columns):
            chunk = chunks.column(column)
            width = _PARQUET_WIDTH.get(chunk.physical_type, 16)
            decoded += max(chunk.total_uncompressed_size, chunk.num_values * width)
    return meta.num_rows, decoded


#: Decoded bytes per value of a Parquet physical type (byte arrays: a 16-byte string view at least).
_PARQUET_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def check_decoded(frame, limits: LoadLimits, source: str) -> None:
    """Refuse a frame whose rows or text exceed ``limits`` before it is turned into arrays.

    Polars keeps dictionary-encoded strings as views of one buffer, so a long value
    repeated on every row costs memory only when it is copied out; it is measured here,
    before that happens.

    Parameters
    ----------
    frame : polars.DataFrame
    limits : LoadLimits
    source : str
    """
    _check_counts(frame.height, sum(decoded_bytes(frame[name]) for name in frame.columns), limits, source)


def decoded_bytes(series) -> int:
    """Bytes of a Polars series once its text is copied out (strings by length, nested values flattened)."""
    import polars as pl

    if series.dtype == pl.String:
        return int(series.str.len_bytes().sum() or 0)
    if isinstance(series.dtype, pl.List):
        return decoded_bytes(series.list.explode())
    if isinstance(series.dtype, pl.Array):
        return decoded_bytes(series.arr.explode())
    return int(series.estimated_size())


def _check_counts(rows: int, decoded: int, limits: LoadLimits, source: str) -> None:
    if rows > limits.max_rows:
        raise CatalogError(f"{rows:,} rows, over the limit of {limits.max_rows:,} rows", source=source)
    if decoded > limits.max_decoded_bytes:
        raise CatalogError(f"decodes to {decoded / MB:,.0f} MB, over the limit of "
                           f"{limits.max_decoded_bytes / MB:,.0f} MB decoded", source=source)
