"""Where the app's catalog comes from: a bundled sample, an upload, or a file on the server.

A :class:`CatalogSource` is a small, hashable description (the app caches catalogs and
indexes by it); :func:`load_source` turns it into a validated :class:`~zerogr_core.Catalog`
or raises a one-line :class:`~zerogr_core.errors.CatalogError` / ``ZeroGRError``.
"""
from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..catalog.catalog import Catalog
from ..errors import CatalogError, ZeroGRError

#: The MovieLens SID catalog of the bundled recommender (the app's default).
MOVIELENS = "movielens"

#: Bundled choices, in the order the app lists them: name → label.
SAMPLE_CHOICES: dict[str, str] = {
    MOVIELENS: "MovieLens SID catalog (ml-latest-small, with the bundled recommender)",
    "search-like-small": "Search-like, small (50,000 items, 5 levels, shared head)",
    "watch-like-small": "Watch-like, small (20,000 items, 3 levels)",
    "synthetic-7-small": "Synthetic-7, small (20,000 items, 7 levels)",
    "tiny": "Tiny (12 hand-written items, 3 levels)",
    "amazon-beauty": "Amazon Beauty SID catalog (12,101 real items, content SIDs 4×256 from tiger-cf, MIT)",
}

#: File types the app accepts.
UPLOAD_TYPES = ("csv", "tsv", "txt", "parquet")


@dataclass(frozen=True)
class CatalogSource:
    """A catalog's origin.

    Attributes
    ----------
    kind : {"sample", "upload", "file"}
    name : str
        Sample name, uploaded file name, or server path as typed.
    path : str or None
        File to read (the staged copy of an upload, or the server path).
    fingerprint : str
        Content hash of an upload, or size+mtime of a server file (cache key).
    on_duplicate : {"error", "collision"}
    codebook_sizes : tuple of int or None
        Declared |V_l| per level (else the file's metadata or max + 1).
    """

    kind: str
    name: str
    path: str | None = None
    fingerprint: str = ""
    on_duplicate: str = "error"
    codebook_sizes: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        if self.kind == "sample":
            return SAMPLE_CHOICES.get(self.name, self.name).split(" (")[0]
        if self.kind == "upload":
            return f"upload: {self.name}"
        return f"file: {self.name}"

    @property
    def is_movielens(self) -> bool:
        return self.kind == "sample" and self.name == MOVIELENS


def default_source() -> CatalogSource:
    """The bundled MovieLens SID catalog."""
    return CatalogSource("sample", MOVIELENS)


def sample_source(name: str, **options) -> CatalogSource:
    if name not in SAMPLE_CHOICES:
        raise ZeroGRError(f"unknown bundled catalog {name!r}; choose one of {', '.join(SAMPLE_CHOICES)}")
    return CatalogSource("sample", name, **options)


def parse_codebook_sizes(text: str) -> tuple[int, ...] | None:
    """Parse "256, 256, 256" (spaces or commas); empty text → ``None``.

    Raises
    ------
    CatalogError
        Naming the bad entry.
    """
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        return None
    sizes = []
    for number, part in enumerate(parts, start=1):
        try:
            value = int(part)
        except ValueError:
            raise CatalogError(f"codebook size {number} ({part!r}) is not a whole number",
                               column="codebook_sizes") from None
        if value < 1:
            raise CatalogError(f"codebook size {number} must be ≥ 1, got {value}", column="codebook_sizes")
        sizes.append(value)
    return tuple(sizes)


def check_extension(name: str) -> None:
    suffix = Path(name).suffix.lower().lstrip(".")
    if suffix not in UPLOAD_TYPES:
        raise CatalogError(f"unsupported file type {('.' + suffix) if suffix else '(none)'!r}; upload one of "
                           f"{', '.join('.' + t for t in UPLOAD_TYPES)}", source=name)


def stage_upload(name: str, data: bytes, max_bytes: int, folder: str | Path | None = None,
                 **options) -> CatalogSource:
    """Check an uploaded file's size and type and write it where the loader can read it.

    Parameters
    ----------
    name : str
        The file name the browser sent (its extension picks the format).
    data : bytes
    max_bytes : int
        The upload limit; larger files are refused with a clear message.
    folder : path, optional
        Where to stage the copy (default: a ``zerogr-uploads`` folder in the temp dir).

    Raises
    ------
    CatalogError
        Over the limit, empty, or an unsupported extension.
    """
    base = Path(name).name or "upload.csv"
    size = len(data)
    if size > max_bytes:
        raise CatalogError(f"file is {size / 2**20:,.1f} MB, over the upload limit of {max_bytes / 2**20:,.0f} MB; "
                           f"for larger catalogs give a file path on the server instead", source=base)
    if size == 0:
        raise CatalogError("file is empty", source=base)
    check_extension(base)
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = Path(folder) if folder is not None else Path(tempfile.gettempdir()) / "zerogr-uploads"
    target = folder / digest / base
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(target)
    return CatalogSource("upload", base, str(target), digest, **options)


def server_file_source(path_text: str, **options) -> CatalogSource:
    """A catalog file on the server, for catalogs too large to upload.

    Raises
    ------
    CatalogError
        Empty path, missing file, a folder, or an unsupported extension.
    """
    text = path_text.strip().strip('"').strip("'")
    if not text:
        raise CatalogError("give the path of a catalog file on the server")
    path = Path(text).expanduser()
    if not path.exists():
        raise CatalogError("no such file", source=text)
    if not path.is_file():
        raise CatalogError("not a regular file", source=text)
    check_extension(path.name)
    stat = path.stat()
    return CatalogSource("file", text, str(path.resolve()), f"{stat.st_size}-{stat.st_mtime_ns}", **options)


def load_source(source: CatalogSource) -> Catalog:
    """Read and validate the catalog of ``source``.

    Raises
    ------
    ZeroGRError
        Any catalog problem (one line naming file, row and column), or a missing bundled model.
    """
    if source.kind == "sample":
        if source.name == MOVIELENS:
            from .movielens import bundled_catalog

            return bundled_catalog()
        from ..catalog.samples import open_catalog

        return open_catalog(source.name, codebook_sizes=source.codebook_sizes, on_duplicate=source.on_duplicate)
    if source.kind in ("upload", "file"):
        from ..catalog.io import load_catalog

        try:
            catalog = load_catalog(source.path, codebook_sizes=source.codebook_sizes,
                                   on_duplicate=source.on_duplicate)
        except CatalogError as err:
            # Name the file as the user knows it, not the staged copy.
            raise err.with_source(source.name) if err.source else err from None
        return catalog
    raise ZeroGRError(f"unknown catalog source kind {source.kind!r}")


def catalog_summary(catalog: Catalog) -> dict:
    """Items, levels, codebook sizes and the yardstick bytes, for the summary panel."""
    return dict(items=catalog.n_items, levels=catalog.n_levels, codebook_sizes=list(catalog.codebook_sizes),
                shared_head=catalog.band_offsets is not None, titles=catalog.titles is not None,
                collision_level_added=catalog.collision_level_added,
                duplicate_groups=catalog.duplicate_groups, sid_table_int16_bytes=catalog.sid_table_bytes_int16())
