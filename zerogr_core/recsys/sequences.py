"""Interaction-sequence data sets (Amazon Beauty and the like) and their semantic IDs.

Two file formats hold one chronological item sequence per user:

* **JSON interactions** (tiger-cf): ``{"user": [item, item, ...], ...}``, items in time
  order; item ids are integers (or strings of digits). A companion **SID file**
  ``{"item": [t1, ..., tL], ...}`` may give every item its semantic ID.
* **Sequence file** (SASRec, S3-Rec, ICLRec: Beauty, Sports, Toys, Yelp): one user per
  line, ``user_id item_id item_id ...`` separated by white space, items in time order.

Both become one :class:`SequenceData` (same interface as
:class:`~zerogr_core.recsys.data.MovieLens` for the split and the SID builder): the items
as a catalog in ascending id order and, per user, the item indices oldest first. Users
with fewer than three interactions are dropped and counted (one each for training,
validation and test). Errors name the file and the line.

Semantic IDs come from the SID file when one is given (content SIDs: built from item
metadata, so they carry no interaction signal from the test split); an extra collision
level is appended only where two items share a SID. Without a SID file they are built
here by RQ-KMeans over collaborative item vectors of the *training* interactions only
(:func:`~zerogr_core.recsys.semantic_ids.build_semantic_ids` with no content signal), with
the collision level on top. Only Python, numpy and torch are needed (no Polars).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import ZeroGRError, shown
from .data import MIN_INTERACTIONS, REPO_ROOT, LeaveOneOut, leave_one_out

#: The bundled Amazon Beauty copy (tiger-cf files, MIT; see its README for the licences).
BEAUTY_DIR = REPO_ROOT / "sample_catalogs" / "amazon-beauty"
#: Named data sets: name -> (interactions file, SID file or None), relative to the repository.
DATASETS = {
    "amazon-beauty": (BEAUTY_DIR / "inter.json", BEAUTY_DIR / "index_rqkmeans.json"),
}


@dataclass(frozen=True, eq=False)
class SequenceData:
    """Chronological user sequences over a catalog of integer item ids.

    Attributes
    ----------
    layout : str
        ``"json-interactions"`` or ``"sequence-file"``.
    directory : Path
        The interactions file (named ``directory`` for the MovieLens interface).
    item_ids : np.ndarray, shape (N,), int64
        Item ids, ascending; item *index* ``i`` is the row here.
    titles : np.ndarray, shape (N,), object (str)
        The item id as text (these files carry no titles).
    user_ids : np.ndarray, shape (U,), object (str)
        Kept users in file order.
    offsets : np.ndarray, shape (U + 1,), int64
        CSR offsets into ``items``.
    items : np.ndarray, shape (I,), int64
        Item indices, oldest first per user.
    dropped_users : int
        Users with fewer than three interactions.
    sid_file : Path or None
    sid_codes : np.ndarray or None, shape (N, L), int64
        The SID file's codes per item index (before any collision level).
    """

    layout: str
    directory: Path
    item_ids: np.ndarray
    titles: np.ndarray
    user_ids: np.ndarray
    offsets: np.ndarray
    items: np.ndarray
    dropped_users: int
    sid_file: Path | None = None
    sid_codes: np.ndarray | None = None

    dropped_ratings = 0

    @property
    def n_items(self) -> int:
        return int(self.item_ids.size)

    @property
    def n_users(self) -> int:
        return int(self.offsets.size - 1)

    def sequence(self, user: int) -> np.ndarray:
        """Item indices of user row ``user``, oldest first; shape (n_u,), int64."""
        return self.items[self.offsets[user]:self.offsets[user + 1]]

    def fingerprint(self) -> str:
        """SHA-256 (hex, 16 chars) of the item ids and sequences (not of the file bytes)."""
        digest = hashlib.sha256()
        for arr in (self.item_ids, self.offsets, self.items):
            digest.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def summary(self) -> dict:
        """Counts for reports, with paths relative to the repository when inside it."""
        return dict(layout=self.layout, directory=_display(self.directory), users=self.n_users,
                    items=self.n_items, interactions=int(self.items.size), dropped_users=self.dropped_users,
                    dropped_ratings=0, sid_file=_display(self.sid_file) if self.sid_file else None,
                    fingerprint=self.fingerprint())


def _display(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------- parsing
def _line_of(text: str, needle: str) -> int:
    """1-based line of the first occurrence of ``needle`` in ``text`` (1 when absent)."""
    pos = text.find(needle)
    return text.count("\n", 0, pos) + 1 if pos >= 0 else 1


#: Largest item id: the loaders hold ids as int64 (a longer one overflowed numpy, a traceback).
MAX_ID = np.iinfo(np.int64).max


def parse_id(value) -> int | None:
    """An item id from a file: a non-negative int, or a string of ASCII digits, at most
    :data:`MAX_ID`; ``None`` when ``value`` is neither (the caller names the file and line).

    ``str.isdigit`` and ``int`` alone accept more than ids: ``'²'`` is a digit that ``int``
    refuses, and ``int`` reads ``' 7'``, ``'1_000'`` and Arabic-Indic digits.
    """
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            return None
        value = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_ID else None


def _as_id(value, path: Path, text: str, key: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ZeroGRError(f"{path}:{_line_of(text, json.dumps(key))}: {what} of {key!r} must be integer ids, "
                          f"got {shown(value)}")
    out = parse_id(value)
    if out is None:
        raise ZeroGRError(f"{path}:{_line_of(text, json.dumps(key))}: {what} of {key!r}: {shown(value)} is not an "
                          f"integer id in 0…{MAX_ID}")
    return out


def _read_json_object(path: Path, what: str) -> tuple[dict, str]:
    path = Path(path)
    if not path.is_file():
        raise ZeroGRError(f"{path}: {what} file not found")
    try:
        text = path.read_text(encoding="utf-8")
        obj = json.loads(text)
    except UnicodeDecodeError:
        raise ZeroGRError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ZeroGRError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg}, column {exc.colno})") from None
    if not isinstance(obj, dict) or not obj:
        raise ZeroGRError(f"{path}:1: expected a non-empty JSON object {{key: [ids...]}}")
    return obj, text


def read_json_interactions(path: str | Path) -> tuple[list[str], list[list[int]]]:
    """Users and their raw item-id sequences from a JSON interactions file.

    Raises
    ------
    ZeroGRError
        Naming the file and line: invalid JSON, a value that is not a list of ids.
    """
    path = Path(path)
    obj, text = _read_json_object(path, "interactions")
    users, seqs = [], []
    for user, items in obj.items():
        if not isinstance(items, list):
            raise ZeroGRError(f"{path}:{_line_of(text, json.dumps(user))}: the items of user {user!r} must be a "
                              f"list, got {type(items).__name__}")
        seqs.append([_as_id(v, path, text, user, "the items") for v in items])
        users.append(str(user))
    return users, seqs


def read_sequence_file(path: str | Path) -> tuple[list[str], list[list[int]]]:
    """Users and their raw item-id sequences from a ``user item item ...`` file.

    Blank lines are skipped. A user listed twice is an error.

    Raises
    ------
    ZeroGRError
        Naming the file and line: a non-integer item id, a duplicate user, no data.
    """
    path = Path(path)
    if not path.is_file():
        raise ZeroGRError(f"{path}: sequence file not found")
    users, seqs, seen = [], [], {}
    try:
        handle = path.open(encoding="utf-8")
        with handle:
            for lineno, line in enumerate(handle, start=1):
                fields = line.split()
                if not fields:
                    continue
                user = fields[0]
                if user in seen:
                    raise ZeroGRError(f"{path}:{lineno}: user {user!r} already listed on line {seen[user]}")
                seen[user] = lineno
                row = []
                for col, tok in enumerate(fields[1:], start=2):
                    item = parse_id(tok)
                    if item is None:
                        raise ZeroGRError(f"{path}:{lineno}: field {col} {shown(tok)} is not a non-negative integer "
                                          f"item id (at most {MAX_ID})")
                    row.append(item)
                users.append(user)
                seqs.append(row)
    except UnicodeDecodeError:
        raise ZeroGRError(f"{path}: not UTF-8 text") from None
    if not users:
        raise ZeroGRError(f"{path}: no user lines")
    return users, seqs


def read_sid_file(path: str | Path) -> dict[int, list[int]]:
    """Item id -> SID tokens from a JSON SID file ``{"item": [t1, ..., tL]}``.

    Tokens and SID length are held to the catalog load limits
    (:func:`~zerogr_core.catalog.limits.limits_from`: 65,536 tokens per level and 16 levels
    unless ``ZEROGR_MAX_CODEBOOK`` / ``ZEROGR_MAX_LEVELS`` say otherwise): the model gets an
    embedding row and an output logit for every token up to the largest, so one token id of
    10^9 would ask for hundreds of GB.

    Raises
    ------
    ZeroGRError
        Naming the file and line: invalid JSON, SIDs of different lengths, non-integer or
        negative tokens, a token or a length over the limits.
    """
    from ..catalog.limits import limits_from

    path = Path(path)
    obj, text = _read_json_object(path, "SID")
    limits = limits_from()
    out, length = {}, None
    for key, sid in obj.items():
        item = _as_id(key, path, text, key, "the id")
        if not isinstance(sid, list) or not sid or not all(isinstance(t, int) and not isinstance(t, bool)
                                                           and t >= 0 for t in sid):
            raise ZeroGRError(f"{path}:{_line_of(text, json.dumps(key))}: the SID of item {key!r} must be a "
                              f"non-empty list of non-negative integers, got {shown(sid)}")
        if length is None:
            length = len(sid)
            if length > limits.max_levels:
                raise ZeroGRError(f"{path}:{_line_of(text, json.dumps(key))}: the SID of item {key!r} has "
                                  f"{length:,} tokens, over the limit of {limits.max_levels} levels "
                                  f"(ZEROGR_MAX_LEVELS)")
        elif len(sid) != length:
            raise ZeroGRError(f"{path}:{_line_of(text, json.dumps(key))}: the SID of item {key!r} has {len(sid)} "
                              f"tokens, the first item's has {length}")
        if max(sid) >= limits.max_codebook:
            level = int(np.argmax(sid)) + 1
            raise ZeroGRError(f"{path}:{_line_of(text, json.dumps(key))}: the SID of item {key!r} has token "
                              f"{max(sid):,} at level {level}, over the limit of {limits.max_codebook:,} tokens "
                              f"per level (ZEROGR_MAX_CODEBOOK)")
        if item in out:
            raise ZeroGRError(f"{path}:{_line_of(text, json.dumps(key))}: item {item} listed twice")
        out[item] = sid
    return out


def detect_format(path: str | Path) -> str:
    """``"json-interactions"`` when the file's first non-blank character is ``{`` or ``[``,
    else ``"sequence-file"``."""
    path = Path(path)
    if not path.is_file():
        raise ZeroGRError(f"{path}: interactions file not found" if not path.is_dir() else
                          f"{path}: expected an interactions file (JSON or 'user item item ...'), got a directory")
    with path.open("rb") as handle:
        head = handle.read(4096).lstrip()
    return "json-interactions" if head[:1] in (b"{", b"[") else "sequence-file"


def load_sequences(path: str | Path, sids: str | Path | None = None) -> SequenceData:
    """Load a JSON interactions file or a sequence file, with an optional SID file.

    Parameters
    ----------
    path : str or Path
        Interactions (format detected by :func:`detect_format`).
    sids : str or Path, optional
        JSON SID file covering every interacted item.

    Returns
    -------
    SequenceData

    Raises
    ------
    ZeroGRError
        Unreadable or malformed file (file and line named), an interacted item missing
        from the SID file, or no user with three interactions.
    """
    path = Path(path)
    layout = detect_format(path)
    users, seqs = read_json_interactions(path) if layout == "json-interactions" else read_sequence_file(path)
    sid_map = read_sid_file(sids) if sids is not None else None
    kept = [(u, s) for u, s in zip(users, seqs) if len(s) >= MIN_INTERACTIONS]
    if not kept:
        raise ZeroGRError(f"{path}: no user has {MIN_INTERACTIONS} or more interactions")
    raw = np.concatenate([np.asarray(s, dtype=np.int64) for _, s in kept])
    item_ids = np.unique(raw)
    codes = None
    if sid_map is not None:
        missing = np.setdiff1d(item_ids, np.fromiter(sid_map, dtype=np.int64, count=len(sid_map)))
        if missing.size:
            raise ZeroGRError(f"{sids}: no SID for item {int(missing[0])} of {path} ({missing.size} items missing;"
                              f" the two files must use the same item ids)")
        # Items with a SID but no interaction stay in the catalog: they can be recommended.
        item_ids = np.asarray(sorted(sid_map), dtype=np.int64)
        codes = np.asarray([sid_map[int(i)] for i in item_ids], dtype=np.int64)
    lengths = np.asarray([len(s) for _, s in kept], dtype=np.int64)
    titles = np.empty(item_ids.size, dtype=object)
    titles[:] = [str(i) for i in item_ids]
    user_ids = np.empty(len(kept), dtype=object)
    user_ids[:] = [u for u, _ in kept]
    return SequenceData(
        layout=layout, directory=path, item_ids=item_ids, titles=titles, user_ids=user_ids,
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        items=np.searchsorted(item_ids, raw).astype(np.int64), dropped_users=len(users) - len(kept),
        sid_file=Path(sids) if sids is not None else None, sid_codes=codes)


def load_dataset(name: str) -> SequenceData:
    """Load a named bundled data set (a key of :data:`DATASETS`)."""
    if name not in DATASETS:
        raise ZeroGRError(f"--dataset: unknown data set {name!r} (choose from {', '.join(DATASETS)})")
    inter, sids = DATASETS[name]
    return load_sequences(inter, sids)


# ---------------------------------------------------------------------------- SIDs
def sequence_semantic_ids(data: SequenceData, split: LeaveOneOut, config=None):
    """The semantic IDs of ``data``: its SID file's, or RQ-KMeans on training interactions.

    Parameters
    ----------
    data : SequenceData
    split : LeaveOneOut
        Its training part ranks items inside a collision group (and, when SIDs are built
        here, is the only signal they come from).
    config : SIDConfig, optional
        For building (default: the ``"shipped"`` preset without the content signal, which
        these files do not have).

    Returns
    -------
    SemanticIds
        ``config`` is ``None`` when the SIDs came from the file.
    """
    from .semantic_ids import SIDConfig, build_semantic_ids, collision_level, semantic_ids_from_codes

    name = Path(data.directory).stem + "-sids"
    if data.sid_codes is None:
        # These files carry no item text, so the collaborative signal is the only one.
        config = replace(config if config is not None else SIDConfig.preset("shipped"), content_weight=0.0)
        return build_semantic_ids(data, split, config, name=name)
    body = data.sid_codes
    sizes = [int(body[:, level].max()) + 1 for level in range(body.shape[1])]
    codes = body
    if np.unique(body, axis=0).shape[0] < body.shape[0]:
        extra = collision_level(body, split.train_counts(data.n_items))
        codes = np.concatenate([body, extra[:, None]], axis=1)
        sizes.append(int(extra.max()) + 1)
    return semantic_ids_from_codes(data, codes, sizes, None, name=name)


def bundled_sid_catalog(name: str = "amazon-beauty"):
    """The SID catalog of a named data set (its SID file), titles = item ids.

    Returns
    -------
    Catalog
    """
    data = load_dataset(name)
    catalog = sequence_semantic_ids(data, leave_one_out(data)).catalog
    return replace(catalog, name=name)
