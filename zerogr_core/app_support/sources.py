"""Where the app's catalog comes from: a bundled sample, an upload, or a file on the server.

A :class:`CatalogSource` is a small, hashable description (the app caches catalogs and
indexes by it); :func:`load_source` turns it into a validated :class:`~zerogr_core.Catalog`
or raises a one-line :class:`~zerogr_core.errors.CatalogError` / ``ZeroGRError``.

The app may be open to a whole team, so a file on the server is read only below a data
root (:func:`app_settings`: the bundled samples, plus ``ZEROGR_DATA_DIR`` and the
``[data] dirs`` of ``.streamlit/zerogr.toml``), its errors never quote its content, and
every load is bounded by :class:`~zerogr_core.catalog.limits.LoadLimits`. The CLI runs
with its user's own rights and uses none of this.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..catalog.catalog import Catalog
from ..catalog.limits import MB, LoadLimits, limits_from
from ..catalog.samples import SAMPLE_DIR
from ..errors import CatalogError, ZeroGRError

#: The MovieLens SID catalog of the bundled recommender (the app's default).
MOVIELENS = "movielens"

#: Bundled choices, in the order the app lists them: name → label.
SAMPLE_CHOICES: dict[str, str] = {
    MOVIELENS: "MovieLens SID catalog (ml-latest-small, with the bundled recommender)",
    "amazon-beauty": "Amazon Beauty SID catalog (12,101 real items, content SIDs 4×256 from tiger-cf, with the bundled "
                     "T5 recommender)",
    "search-like-small": "Search-like, small (50,000 items, 5 levels, shared head)",
    "watch-like-small": "Watch-like, small (20,000 items, 3 levels)",
    "synthetic-7-small": "Synthetic-7, small (20,000 items, 7 levels)",
    "tiny": "Tiny (12 hand-written items, 3 levels)",
}

#: Where the bundled real data comes from and under which terms (shown beside the choice).
SAMPLE_CREDITS: dict[str, str] = {
    MOVIELENS: "Data: MovieLens ml-latest-small © GroupLens, University of Minnesota (Harper & Konstan 2015), "
               "redistributed under its licence: non-commercial use, no endorsement implied, cite it. Terms and "
               "the recommender: `sample_catalogs/movielens/` (README.md, ml-latest-small/README.txt).",
    "amazon-beauty": "Data: Amazon review data, Beauty 5-core (McAuley et al. 2015; He & McAuley 2016), research "
                     "use, cite both. Interactions and content SIDs from tiger-cf (MIT, `LICENCE-tiger-cf.txt`), "
                     "the sequence file from ICLRec / S3-Rec (BSD-3, `LICENSE-ICLRec.txt`); with a trained T5 "
                     "recommender (`model.pt`). All in `sample_catalogs/amazon-beauty/` (README.md).",
}

#: File types the app accepts.
UPLOAD_TYPES = ("csv", "tsv", "txt", "parquet")


#: Extra data roots for server files, separated by ``os.pathsep`` (``:`` on Linux).
ENV_DATA_DIR = "ZEROGR_DATA_DIR"
#: Path of the app's settings file (default :data:`CONFIG_FILE`).
ENV_CONFIG = "ZEROGR_CONFIG"
#: The app's settings: ``[data] dirs = [...]`` and ``[limits] preset / max_rows / max_file_mb /
#: max_decoded_mb / max_levels / max_codebook``. Relative dirs are taken from the repository root. Optional.
CONFIG_FILE = SAMPLE_DIR.parent / ".streamlit" / "zerogr.toml"
#: How to add a data root, for the page and the refusal message.
HOW_TO_ADD_ROOT = (f"start the app with {ENV_DATA_DIR}=/path/to/catalogs (several folders separated by "
                   f"'{os.pathsep}') or list them in .streamlit/zerogr.toml as [data] dirs = [\"/path/to/catalogs\"]")


@dataclass(frozen=True)
class AppSettings:
    """Where the app may read server files, and how large a catalog it loads.

    Attributes
    ----------
    roots : tuple of Path
        Resolved data roots, the bundled samples first; server files must lie below one.
    limits : LoadLimits
        Bounds on every catalog file the app loads (uploads and server files).
    missing_roots : tuple of str
        Configured roots that are not existing folders (ignored, shown on the page).
    """

    roots: tuple[Path, ...]
    limits: LoadLimits
    missing_roots: tuple[str, ...] = ()

    @property
    def extra_roots(self) -> tuple[Path, ...]:
        """Roots beyond the bundled samples."""
        return self.roots[1:]


def app_settings(environ: Mapping[str, str] | None = None, config_file: str | Path | None = None) -> AppSettings:
    """Data roots and load limits from the environment and ``.streamlit/zerogr.toml``.

    Parameters
    ----------
    environ : mapping, optional
        Default ``os.environ``: ``ZEROGR_DATA_DIR``, ``ZEROGR_CONFIG``, and the limit
        variables of :func:`~zerogr_core.catalog.limits.limits_from`.
    config_file : path, optional
        Default ``$ZEROGR_CONFIG`` or :data:`CONFIG_FILE`; absent is fine.

    Raises
    ------
    ZeroGRError
        An unreadable settings file, or a bad entry, naming the file and the key.
    """
    environ = os.environ if environ is None else environ
    path = Path(config_file or environ.get(ENV_CONFIG) or CONFIG_FILE)
    config: dict = {}
    if path.is_file():
        try:
            import tomllib as toml_reader
        except ModuleNotFoundError:  # Python 3.10: the TOML reader Streamlit itself uses
            import toml as toml_reader
        try:
            config = toml_reader.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:  # both readers' decode errors are ValueErrors
            raise ZeroGRError(f"{path}: cannot read the settings ({err})") from None
    data, limits = config.get("data", {}), config.get("limits", {})
    if not isinstance(data, dict) or not isinstance(limits, dict):
        raise ZeroGRError(f"{path}: [data] and [limits] must be tables")
    dirs = data.get("dirs", [])
    if isinstance(dirs, str) or not all(isinstance(d, str) for d in dirs):
        raise ZeroGRError(f"{path}: [data] dirs must be a list of folder paths, e.g. dirs = [\"/data/catalogs\"]")
    configured = [(d, SAMPLE_DIR.parent) for d in dirs]
    configured += [(d, Path.cwd()) for d in environ.get(ENV_DATA_DIR, "").split(os.pathsep) if d.strip()]
    roots, missing = [SAMPLE_DIR.resolve()], []
    for text, base in configured:
        try:
            root = (base / Path(text.strip()).expanduser()).resolve()
        except (OSError, RuntimeError):
            root = None
        if root is None or not root.is_dir():
            missing.append(text)
        elif root not in roots:
            roots.append(root)
    units = {"max_rows": ("max_rows", 1), "max_file_mb": ("max_file_bytes", MB),
             "max_decoded_mb": ("max_decoded_bytes", MB), "max_levels": ("max_levels", 1),
             "max_codebook": ("max_codebook", 1)}
    overrides = {}
    for key, value in limits.items():
        if key == "preset":
            continue
        if key not in units or not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ZeroGRError(f"{path}: [limits] {key} = {value!r}: use preset or one of {', '.join(units)} "
                              f"with a number")
        overrides[units[key][0]] = int(value * units[key][1])
    return AppSettings(tuple(roots), limits_from(limits.get("preset"), overrides, environ), tuple(missing))


def roots_line(roots: Iterable) -> str:
    """The data roots as one readable list."""
    return ", ".join(str(root) for root in roots)


def refusal(roots: Sequence[Path]) -> CatalogError:
    """The one answer for a server path the app will not read: missing, outside every root, or
    not a regular file alike, so the answer tells nothing about what exists on the server."""
    return CatalogError(f"no catalog file at that path inside the data folders. The app reads server files only "
                        f"below {roots_line(roots)}; to add a folder, {HOW_TO_ADD_ROOT}.")


def resolve_server_path(path_text: str, roots: Sequence[Path]) -> Path:
    """The real path of a regular file that ``path_text`` names below one of ``roots``.

    A relative path is looked up in each root in turn. ``~`` is expanded, then the path is
    resolved (``..`` and every symbolic link) before the check, so a link or ``..`` that
    leads outside the roots is refused like a missing file.

    Parameters
    ----------
    path_text : str
        The path as typed (surrounding spaces and quotes are dropped).
    roots : sequence of Path
        Resolved data roots (:attr:`AppSettings.roots`).

    Raises
    ------
    CatalogError
        Empty text or an unsupported extension (said as such: neither depends on the
        server's files); otherwise :func:`refusal`.
    """
    text = path_text.strip().strip('"').strip("'")
    if not text:
        raise CatalogError("give the path of a catalog file on the server")
    check_extension(text, server=True)
    roots = [Path(root) for root in roots]
    if "\x00" in text:
        raise refusal(roots)
    try:
        typed = Path(text).expanduser()
    except RuntimeError:  # ~user that does not exist
        raise refusal(roots) from None
    for candidate in [typed] if typed.is_absolute() else [root / typed for root in roots]:
        try:
            real = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if any(real.is_relative_to(root) for root in roots) and real.is_file() and \
                Path(real.name).suffix.lower().lstrip(".") in UPLOAD_TYPES:
            return real
    raise refusal(roots)


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


def check_extension(name: str, server: bool = False) -> None:
    """Refuse a catalog file name whose extension picks no reader.

    Parameters
    ----------
    name : str
        An upload's file name, or a server path as typed.
    server : bool
        ``name`` is a server path: it is told what the path needs, not to upload a file.

    Raises
    ------
    CatalogError
        Naming the extension found and the ones read.
    """
    suffix = Path(name).suffix.lower().lstrip(".")
    if suffix not in UPLOAD_TYPES:
        wanted = ", ".join("." + t for t in UPLOAD_TYPES)
        fix = f"the path needs one of the extensions {wanted}" if server else f"upload one of {wanted}"
        raise CatalogError(f"unsupported file type {('.' + suffix) if suffix else '(none)'!r}; {fix}", source=name)


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
        Where to stage the copy (default: this process's private ``zerogr-uploads-*`` folder
        in the temp dir, removed at exit; at most :data:`MAX_STAGED_UPLOADS` uploads are kept).

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
    folder = Path(folder) if folder is not None else _staging_folder()
    target = folder / digest / base
    if not (target.is_file() and target.read_bytes() == data):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(target)
    os.utime(target.parent)
    _prune_staged(folder, keep=target.parent)
    return CatalogSource("upload", base, str(target), digest, **options)


def restage_upload(source: CatalogSource, data: bytes | None, folder: str | Path | None = None) -> CatalogSource:
    """``source`` with its staged copy on disk: written again from ``data`` if it was pruned.

    Other sessions' uploads prune the staging folder (:data:`MAX_STAGED_UPLOADS`) and other
    catalogs evict the shared catalog cache; a session keeps its active upload's bytes so
    that neither can take its catalog away.

    Parameters
    ----------
    source : CatalogSource
        Any source; only an upload whose copy is gone is staged again.
    data : bytes or None
        The upload's bytes (checked against ``source.fingerprint``); ``None``: not kept.
    folder : path, optional
        As for :func:`stage_upload`.

    Returns
    -------
    CatalogSource
        ``source`` itself, or the same upload staged again (the same path while this
        process's staging folder lives).
    """
    if source.kind != "upload" or (source.path and Path(source.path).is_file()) or data is None:
        return source
    if hashlib.sha256(data).hexdigest()[:16] != source.fingerprint:
        return source
    return stage_upload(source.name, data, len(data), folder, on_duplicate=source.on_duplicate,
                        codebook_sizes=source.codebook_sizes)


#: Staged uploads kept per process; older ones are deleted (a session that needs one again
#: stages it again from the uploader's bytes, see :func:`restage_upload`).
MAX_STAGED_UPLOADS = 16
_staging: Path | None = None


def _staging_folder() -> Path:
    """This process's private staging folder (mode 0700, removed at exit).

    A fixed, shared folder in the temp dir would let another local user plant or swap the
    file a session is about to load; a fresh ``mkdtemp`` folder cannot be pre-created.
    """
    global _staging
    if _staging is None or not _staging.is_dir():
        _staging = Path(tempfile.mkdtemp(prefix="zerogr-uploads-"))
        atexit.register(shutil.rmtree, _staging, True)
    return _staging


def _prune_staged(folder: Path, keep: Path) -> None:
    """Delete the oldest staged uploads beyond :data:`MAX_STAGED_UPLOADS` (never ``keep``)."""
    try:
        entries = sorted((p for p in folder.iterdir() if p.is_dir() and p != keep), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in entries[:max(0, len(entries) + 1 - MAX_STAGED_UPLOADS)]:
        shutil.rmtree(old, ignore_errors=True)


def server_file_source(path_text: str, roots: Sequence[Path] | None = None, **options) -> CatalogSource:
    """A catalog file on the server below a data root, for catalogs too large to upload.

    Parameters
    ----------
    path_text : str
        The path as typed: absolute, or relative to a data root.
    roots : sequence of Path, optional
        Default :func:`app_settings`'s roots.

    Raises
    ------
    CatalogError
        Empty path or unsupported extension; else one message, the same for a missing
        file, a folder and a path outside the roots (:func:`resolve_server_path`).
    """
    roots = app_settings().roots if roots is None else roots
    real = resolve_server_path(path_text, roots)
    stat = real.stat()
    return CatalogSource("file", path_text.strip().strip('"').strip("'"), str(real),
                         f"{stat.st_size}-{stat.st_mtime_ns}", **options)


def load_source(source: CatalogSource, limits: LoadLimits | None = None) -> Catalog:
    """Read and validate the catalog of ``source``.

    Uploads and server files are bounded by ``limits`` (default :func:`app_settings`'s), as
    are codebook sizes declared for a bundled sample (the MovieLens catalog is laid out in
    them too); errors about a server file name row and column but never quote the file.

    Raises
    ------
    ZeroGRError
        Any catalog problem (one line naming file, row and column), or a missing bundled model.
    """
    if source.kind == "sample":
        if source.codebook_sizes is not None:
            # Declared sizes are the user's, not the sample's: bounded as a file's are, before any work.
            limits = app_settings().limits if limits is None else limits
            limits.check_shape(len(source.codebook_sizes), source.codebook_sizes, source.label)
        if source.name == MOVIELENS:
            from ..recsys.movielens import bundled_catalog

            catalog = bundled_catalog()
            if source.codebook_sizes is None:
                return catalog
            # The recommender's own catalog has no file to declare sizes for: its SIDs are laid
            # out again in the declared codebooks (the bundled model is then not offered).
            try:
                return Catalog.from_sids(catalog.sids, source.codebook_sizes, item_ids=catalog.item_ids,
                                         titles=catalog.titles, on_duplicate=source.on_duplicate, name=catalog.name)
            except CatalogError as err:
                raise err.with_source(source.label) from None
        from ..catalog.samples import open_catalog

        return open_catalog(source.name, codebook_sizes=source.codebook_sizes, on_duplicate=source.on_duplicate)
    if source.kind in ("upload", "file"):
        from ..catalog.io import load_catalog

        limits = app_settings().limits if limits is None else limits
        server = source.kind == "file"
        try:
            catalog = load_catalog(source.path, codebook_sizes=source.codebook_sizes,
                                   on_duplicate=source.on_duplicate, limits=limits, redact_values=server)
        except CatalogError as err:
            # Name the file as the user knows it, not the staged copy.
            raise err.with_source(source.name) if err.source else err from None
        except ZeroGRError:
            raise
        except Exception as err:  # noqa: BLE001 — a reader's own message may quote the file
            if not server:
                raise
            raise CatalogError(f"cannot read this file ({type(err).__name__})", source=source.name) from None
        return catalog
    raise ZeroGRError(f"unknown catalog source kind {source.kind!r}")


def catalog_summary(catalog: Catalog) -> dict:
    """Items, levels, codebook sizes and the yardstick bytes, for the summary panel."""
    return dict(items=catalog.n_items, levels=catalog.n_levels, codebook_sizes=list(catalog.codebook_sizes),
                shared_head=catalog.band_offsets is not None, titles=catalog.titles is not None,
                collision_level_added=catalog.collision_level_added,
                duplicate_groups=catalog.duplicate_groups, sid_table_int16_bytes=catalog.sid_table_bytes_int16())
