"""Catalog files: CSV, TSV and Parquet in two layouts.

Layouts
-------
* per level: ``item_id, s1, s2, …, sL`` with one integer column per level;
* one column: ``item_id, sid`` where ``sid`` is a string of tokens separated by spaces
  or commas (``"3 5 1"``, ``"3,5,1"``) or, in Parquet, a list column.

Item ids are integers, or strings such as ASINs (``B00ABC1234``): a column whose ids
are all canonical integers loads as int64, any other keeps every id as its string.
An optional ``title`` column holds human-readable names; other columns are ignored.
Column names are matched case-insensitively. The format follows the extension:
``.csv`` (comma), ``.tsv`` and ``.txt`` (tab), ``.parquet``.

Every problem raises a one-line :class:`~zerogr_core.errors.CatalogError` that names the
file, the data row (1-based, header excluded) and the column. This is the only module
that imports Polars, so the GPU path never needs it.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import NoReturn

import numpy as np
import polars as pl
from numpy.dtypes import StringDType

from ..errors import CatalogError, redacted_values, shown, values_redacted
from .catalog import Catalog, level_names
from .limits import LoadLimits, check_decoded, check_extent

#: Extension → format name.
FORMATS = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv", ".parquet": "parquet"}
_SEPARATORS = {"csv": ",", "tsv": "\t"}
#: Parquet key-value metadata written by :func:`save_catalog`.
META_CODEBOOK_SIZES = "zerogr.codebook_sizes"
META_BAND_OFFSETS = "zerogr.band_offsets"
_LEVEL_COLUMN = re.compile(r"^s(0|[1-9]\d*)$")
_TOKEN = r"[^\s,]+"


def catalog_format(path: str | Path) -> str:
    """Format of a catalog file from its extension: ``"csv"``, ``"tsv"`` or ``"parquet"``.

    Raises
    ------
    CatalogError
        The extension is not one of ``.csv``, ``.tsv``, ``.txt``, ``.parquet``.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise CatalogError(f"unsupported extension {suffix or '(none)'!r}; use one of "
                           f"{', '.join(FORMATS)}", source=str(path))
    return FORMATS[suffix]


def load_catalog(path: str | Path, *, codebook_sizes=None, on_duplicate: str = "error",
                 max_bytes: int | None = None, limits: LoadLimits | None = None,
                 redact_values: bool = False) -> Catalog:
    """Read, validate and sort a catalog file.

    Parameters
    ----------
    path : str or Path
        A ``.csv``, ``.tsv``/``.txt`` or ``.parquet`` file in either layout.
    codebook_sizes : sequence of int, optional
        |V_l| per level. Default: the sizes stored in the Parquet metadata by
        :func:`save_catalog`, otherwise inferred as ``max + 1`` per level.
    on_duplicate : {"error", "collision"}
        Items sharing a SID raise, or get a TIGER-style collision level appended.
    max_bytes : int, optional
        Refuse files larger than this (the app's upload limit).
    limits : LoadLimits, optional
        Refuse, before materialising it, a file over these row, size or decoded-size
        limits (the app's bounds; the CLI passes none).
    redact_values : bool
        Error messages name row and column but withhold the file's values (the app's
        server files, which the viewer may not be allowed to read).

    Returns
    -------
    Catalog
        Rows sorted lexicographically; ``name`` is the file's stem.

    Raises
    ------
    CatalogError
        Missing, empty, oversized or unreadable file; missing ``item_id`` or SID columns;
        missing values; ragged ``sid`` strings; non-integer, negative or out-of-codebook
        tokens; empty or duplicate item ids (integer or string); duplicate SIDs (with
        ``on_duplicate="error"``).
    """
    if redact_values and not values_redacted():
        with redacted_values():
            return load_catalog(path, codebook_sizes=codebook_sizes, on_duplicate=on_duplicate,
                                max_bytes=max_bytes, limits=limits)
    path = Path(path)
    source = str(path)
    fmt = catalog_format(path)
    _check_file(path, max_bytes)
    if limits is not None:
        check_extent(path, fmt, _SEPARATORS.get(fmt), limits, source)
    frame, metadata = _read_frame(path, fmt)
    if limits is not None:
        check_decoded(frame, limits, source)
    columns = _column_map(frame, source)
    if "item_id" not in columns:
        raise CatalogError(f"no 'item_id' column (columns: {shown(', '.join(frame.columns), quote=False)})",
                           source=source)
    layout_columns = _layout(columns, source)
    if limits is not None and layout_columns != ["sid"]:
        limits.check_shape(len(layout_columns), None, source)
    if frame.height == 0:
        raise CatalogError("no data rows", source=source)
    item_ids = _id_column(frame[columns["item_id"]], columns["item_id"], source, typed=fmt == "parquet")
    if layout_columns == ["sid"]:
        sids = _sid_column(frame[columns["sid"]], columns["sid"], source)
    else:
        sids = np.stack([_int_column(frame[columns[name]], columns[name], source)
                         for name in layout_columns],
                        axis=1)
    if limits is not None:
        declared = codebook_sizes if codebook_sizes is not None else \
            _int_tuple_metadata(metadata, META_CODEBOOK_SIZES, source)
        # a token beyond a declared codebook is the loader's own error below
        limits.check_shape(sids.shape[1], declared or (sids.max(axis=0) + 1).tolist(), source)
    titles = None
    if "title" in columns:
        titles = np.array(frame[columns["title"]].cast(pl.String).fill_null("").to_list(), dtype=object)
    band_offsets = None
    if codebook_sizes is None:
        codebook_sizes = _int_tuple_metadata(metadata, META_CODEBOOK_SIZES, source)
        band_offsets = _int_tuple_metadata(metadata, META_BAND_OFFSETS, source)
    try:
        return Catalog.from_sids(sids, codebook_sizes, item_ids=item_ids, titles=titles,
                                 band_offsets=band_offsets, on_duplicate=on_duplicate, name=path.stem)
    except CatalogError as err:
        if layout_columns == ["sid"] and err.column in level_names(sids.shape[1]):
            level = level_names(sids.shape[1]).index(err.column) + 1
            raise CatalogError(f"{err.reason} (token {level})", row=err.row, column=columns["sid"],
                               source=source) from None
        if layout_columns != ["sid"]:  # the file's own names for the catalog's s1 … sL
            names = [columns[name] for name in layout_columns]
            if err.column == "sid":  # the SID is spread over the level columns
                spread = names[0] if len(names) == 1 else f"{names[0]}–{names[-1]}"
                raise CatalogError(err.reason, row=err.row, column=spread, source=source) from None
            if err.column in level_names(len(names)):
                raise CatalogError(err.reason, row=err.row, column=names[level_names(len(names)).index(err.column)],
                                   source=source) from None
        raise err.with_source(source) from None


def save_catalog(catalog: Catalog, path: str | Path) -> Path:
    """Write ``catalog`` in the per-level layout (``item_id, s1 … sL[, title]``).

    Rows are written in the catalog's sorted order. Parquet files also keep the codebook
    sizes and band offsets in their metadata, so :func:`load_catalog` restores them;
    CSV/TSV readers must pass ``codebook_sizes`` to get unused top tokens back.

    Parameters
    ----------
    catalog : Catalog
    path : str or Path
        Destination; the extension picks the format.

    Returns
    -------
    Path
        ``path``.
    """
    path = Path(path)
    fmt = catalog_format(path)
    data = {"item_id": (pl.Series("item_id", catalog.item_ids.tolist(), dtype=pl.String)
                        if catalog.string_ids else catalog.item_ids.astype(np.int64))}
    for level, name in enumerate(level_names(catalog.n_levels)):
        data[name] = catalog.sids[:, level]
    if catalog.titles is not None:
        data["title"] = pl.Series("title", catalog.titles.tolist(), dtype=pl.String)
    frame = pl.DataFrame(data)
    if fmt == "parquet":
        metadata = {META_CODEBOOK_SIZES: ",".join(map(str, catalog.codebook_sizes))}
        if catalog.band_offsets is not None:
            metadata[META_BAND_OFFSETS] = ",".join(map(str, catalog.band_offsets))
        frame.write_parquet(path, metadata=metadata)
    else:
        frame.write_csv(path, separator=_SEPARATORS[fmt])
    return path


# ---------------------------------------------------------------------------- reading
def _check_file(path: Path, max_bytes: int | None) -> None:
    if not path.exists():
        raise CatalogError("no such file", source=str(path))
    if not path.is_file():
        raise CatalogError("not a regular file", source=str(path))
    size = path.stat().st_size
    if size == 0:
        raise CatalogError("file is empty", source=str(path))
    if max_bytes is not None and size > max_bytes:
        raise CatalogError(f"file is {size:,} bytes, over the limit of {max_bytes:,}", source=str(path))


def _read_frame(path: Path, fmt: str) -> tuple[pl.DataFrame, dict[str, str]]:
    """The file as a DataFrame (CSV/TSV: every column a string) and its Parquet metadata."""
    if fmt != "parquet":
        _check_line_ends(path)
    try:
        if fmt == "parquet":
            return pl.read_parquet(path), pl.read_parquet_metadata(path)
        return pl.read_csv(path, separator=_SEPARATORS[fmt], infer_schema=False), {}
    except pl.exceptions.NoDataError:
        raise CatalogError("file is empty", source=str(path)) from None
    except pl.exceptions.PolarsError as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if fmt != "parquet" and "more fields" in reason:
            _raise_extra_fields(path, _SEPARATORS[fmt])
        raise CatalogError(f"cannot read as {fmt.upper()}: {shown(reason, quote=False)}", source=str(path)) from None


def _check_line_ends(path: Path) -> None:
    """Refuse a text file whose lines end in a bare carriage return (classic Mac OS): Polars would
    read it as a header alone and report no data rows."""
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    first = head.find(b"\r")
    if first >= 0 and head[first + 1:first + 2] != b"\n" and b"\n" not in head[:first]:
        raise CatalogError("lines end in a bare carriage return (\\r); save the file with \\n or \\r\\n line ends",
                           source=str(path))


def _raise_extra_fields(path: Path, separator: str) -> NoReturn:
    """Locate the first data row with more fields than the header (Polars does not say)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        reader = csv.reader(handle, delimiter=separator)
        header = next(reader)
        for row, fields in enumerate(reader):
            if len(fields) > len(header):
                raise CatalogError(f"{len(fields)} fields but the header has {len(header)}", row=row,
                                   source=str(path))
    raise CatalogError("a row has more fields than the header", source=str(path))


def _column_map(frame: pl.DataFrame, source: str) -> dict[str, str]:
    """Normalised (stripped, lower-case) column name → name in the file."""
    columns: dict[str, str] = {}
    for name in frame.columns:
        key = name.strip().lower()
        if key in columns:
            raise CatalogError(f"column appears twice (as {shown(columns[key])} and {shown(name)})",
                               column=None if values_redacted() else key, source=source)
        columns[key] = name
    return columns


def _layout(columns: dict[str, str], source: str) -> list[str]:
    """Normalised SID column names: ``["sid"]``, or the level columns in order, s1 … sL or
    (numbered from zero, as many SID exports are) s0 … s(L-1)."""
    levels: dict[int, str] = {}
    for key in columns:
        match = _LEVEL_COLUMN.match(key)
        if match:
            levels[int(match.group(1))] = key
    if "sid" in columns and levels:
        raise CatalogError("both a 'sid' column and level columns s1…; keep one layout", column="sid",
                           source=source)
    if "sid" in columns:
        return ["sid"]
    if not levels:
        raise CatalogError("no SID columns: expected 's1', 's2', … (one per level) or 'sid'",
                           source=source)
    first, top = (0 if 0 in levels else 1), max(levels)
    for number in range(first, top + 1):
        if number not in levels:
            raise CatalogError(f"level columns must run s{first}…s{top} without gaps", column=f"s{number}",
                               source=source)
    return [levels[number] for number in range(first, top + 1)]


def _int_column(series: pl.Series, column: str, source: str, width: int = 1) -> np.ndarray:
    """Parse a column (or ``width`` flattened tokens per row) into int64, or raise at the bad row.

    Parameters
    ----------
    series : pl.Series, shape (N·width,)
        Integer, float or string values.
    column : str
        Column name for messages.
    width : int
        Values per data row (the SID length for a flattened ``sid`` column).

    Returns
    -------
    np.ndarray, shape (N·width,), int64
    """
    def fail(index: int, reason: str) -> CatalogError:
        token = f" (token {index % width + 1})" if width > 1 else ""
        return CatalogError(reason + token, row=index // width, column=column, source=source)

    dtype = series.dtype
    if dtype == pl.UInt64:  # past int64 no value is a token or an id this library stores
        past = series > 2**63 - 1
        if past.any():
            index = int(past.arg_true()[0])
            raise fail(index, f"{series[index]} is past the 64-bit signed range")
        values = series
    elif dtype.is_integer():
        values = series
    elif dtype.is_float():
        bad = series.is_null() | series.is_nan()
        if bad.any():
            raise fail(int(bad.arg_true()[0]), "missing value")
        fractional = (series != series.round()) | series.is_infinite()
        if fractional.any():
            index = int(fractional.arg_true()[0])
            raise fail(index, f"{shown(series[index])} is not an integer")
        past = (series >= 2.0**63) | (series < -2.0**63)  # the cast to int64 would refuse them in Polars' words
        if past.any():
            index = int(past.arg_true()[0])
            raise fail(index, f"{shown(series[index])} is past the 64-bit signed range")
        values = series.cast(pl.Int64)
    elif dtype == pl.String:
        text = series.str.strip_chars()
        empty = text.is_null() | (text == "")
        if empty.any():
            raise fail(int(empty.arg_true()[0]), "missing value")
        values = text.cast(pl.Int64, strict=False)
        bad = values.is_null()
        if bad.any():
            index = int(bad.arg_true()[0])
            raise fail(index, f"{shown(text[index])} is not an integer")
    else:
        raise CatalogError(f"column has type {dtype}, expected integers", column=column, source=source)
    missing = values.is_null()
    if missing.any():
        raise fail(int(missing.arg_true()[0]), "missing value")
    return values.cast(pl.Int64).to_numpy()


_CANONICAL_INT = r"^-?(0|[1-9][0-9]{0,18})$"
"""An integer written as Python writes it, of at most 19 digits (int64 holds every 18-digit one and
the 19-digit ones up to 9,223,372,036,854,775,807; the cast below finds those past it)."""


def _id_column(series: pl.Series, column: str, source: str, typed: bool = False) -> np.ndarray:
    """Parse the ``item_id`` column: int64 when every id is a canonical integer within int64, else strings.

    A text column that is not all integers (``B00ABC1234``, ``007``) keeps every id as
    the string in the file (surrounding blanks removed), so ids round-trip exactly; with
    ``typed`` (Parquet, whose columns carry their type) a string column always gives
    string ids. Empty ids are a row error; duplicates are reported by
    :func:`normalize_item_ids`.

    Returns
    -------
    np.ndarray, shape (N,), int64 or StringDType
    """
    dtype = series.dtype
    if dtype.is_integer() or dtype.is_float():
        return _int_column(series, column, source)
    if dtype not in (pl.String, pl.Categorical) and not isinstance(dtype, pl.Enum):
        raise CatalogError(f"column has type {dtype}, expected integer or string ids", column=column,
                           source=source)
    text = series.cast(pl.String).str.strip_chars()
    empty = text.is_null() | (text == "")
    if empty.any():
        raise CatalogError("missing value (empty item id)", row=int(empty.arg_true()[0]), column=column,
                           source=source)
    if not typed and text.str.contains(_CANONICAL_INT).all():
        ints = text.cast(pl.Int64, strict=False)  # null where a 19-digit id is past int64
        if not ints.is_null().any():
            return ints.to_numpy()
    return text.to_numpy().astype(StringDType())


def _sid_column(series: pl.Series, column: str, source: str) -> np.ndarray:
    """Split the ``sid`` column (strings or lists) into an (N, L) int64 table."""
    if isinstance(series.dtype, pl.Array):
        tokens = series.cast(pl.List(series.dtype.inner))
    elif isinstance(series.dtype, pl.List):
        tokens = series
    else:
        tokens = series.cast(pl.String).str.extract_all(_TOKEN)
    lengths = tokens.list.len().fill_null(0)
    empty = lengths == 0
    if empty.any():
        raise CatalogError("missing value", row=int(empty.arg_true()[0]), column=column, source=source)
    n_levels = int(lengths[0])
    ragged = lengths != n_levels
    if ragged.any():
        row = int(ragged.arg_true()[0])
        raise CatalogError(f"{int(lengths[row])} tokens, but row 1 has {n_levels}", row=row, column=column,
                           source=source)
    flat = _int_column(tokens.explode(), column, source, width=n_levels)
    return flat.reshape(-1, n_levels)


def _int_tuple_metadata(metadata: dict[str, str], key: str, source: str) -> tuple[int, ...] | None:
    if key not in metadata:
        return None
    try:
        return tuple(int(v) for v in metadata[key].split(","))
    except ValueError:
        raise CatalogError(f"Parquet metadata {key}={shown(metadata[key])} is not a list of integers",
                           source=source) from None
