"""MovieLens loaders and the leave-one-out split.

Three layouts are recognised in a directory:

* ``ml-latest-small`` (and the other ``ml-latest*`` releases): ``ratings.csv`` and
  ``movies.csv``, comma-separated with a header, UTF-8;
* ``ml-1m``: ``ratings.dat`` and ``movies.dat``, ``::``-separated, Latin-1;
* ``ml-100k``: ``u.data`` (tab-separated ratings) and ``u.item`` (``|``-separated,
  Latin-1, 19 genre flag columns).

Every layout becomes one :class:`MovieLens`: the movies as catalog items (ascending movie
id) and, per user, the rated movies in chronological order. Ties in time keep file order.
Ratings of movies absent from the movie file are dropped and counted; users with fewer
than three ratings are dropped and counted. Polars is used here only, and only by the
MovieLens readers, so the split, the model and the decoding path import with torch and
numpy alone.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import polars as pl
except ImportError:  # the sequence-file loaders, training and decoding run without Polars
    pl = None

from ..errors import ZeroGRError

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Directory of the bundled ml-latest-small copy (the default data set).
BUNDLED_DIR = REPO_ROOT / "sample_catalogs" / "movielens" / "ml-latest-small"

#: Minimum ratings a user needs: one for training, one for validation, one for test.
MIN_INTERACTIONS = 3

#: Genre names of the ML-100K ``u.item`` flag columns, in column order (from its README).
ML100K_GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
                 "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
                 "Romance", "Sci-Fi", "Thriller", "War", "Western")

#: Layout name -> (ratings file, movies file).
LAYOUTS = {
    "ml-latest-small": ("ratings.csv", "movies.csv"),
    "ml-1m": ("ratings.dat", "movies.dat"),
    "ml-100k": ("u.data", "u.item"),
}


@dataclass(frozen=True, eq=False)
class MovieLens:
    """A MovieLens data set as catalog items and chronological user sequences.

    Attributes
    ----------
    layout : str
        ``"ml-latest-small"``, ``"ml-1m"`` or ``"ml-100k"``.
    directory : Path
    item_ids : np.ndarray, shape (N,), int64
        Movie ids, ascending. Item *index* ``i`` (used everywhere else) is the row here.
    titles : np.ndarray, shape (N,), object (str)
    genres : np.ndarray, shape (N,), object (tuple of str)
    user_ids : np.ndarray, shape (U,), int64
        Kept users (≥ 3 ratings), ascending.
    offsets : np.ndarray, shape (U + 1,), int64
        CSR offsets: user ``u`` rated ``items[offsets[u]:offsets[u + 1]]``.
    items : np.ndarray, shape (I,), int64
        Item indices in chronological order per user.
    timestamps : np.ndarray, shape (I,), int64
        Unix seconds, aligned with ``items``.
    dropped_users : int
        Users removed for having fewer than three ratings.
    dropped_ratings : int
        Ratings removed because their movie is not in the movie file.
    """

    layout: str
    directory: Path
    item_ids: np.ndarray
    titles: np.ndarray
    genres: np.ndarray
    user_ids: np.ndarray
    offsets: np.ndarray
    items: np.ndarray
    timestamps: np.ndarray
    dropped_users: int
    dropped_ratings: int

    @property
    def n_items(self) -> int:
        return int(self.item_ids.size)

    @property
    def n_users(self) -> int:
        return int(self.user_ids.size)

    def sequence(self, user: int) -> np.ndarray:
        """Item indices rated by user row ``user``, oldest first; shape (n_u,), int64."""
        return self.items[self.offsets[user]:self.offsets[user + 1]]

    def fingerprint(self) -> str:
        """SHA-256 (hex, 16 chars) of the loaded interactions and movie ids.

        Independent of file formatting, so the same data read from two layouts or two
        copies matches; used to tie a checkpoint to the data it was trained on.
        """
        digest = hashlib.sha256()
        for arr in (self.item_ids, self.user_ids, self.offsets, self.items, self.timestamps):
            digest.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def summary(self) -> dict:
        """Counts for reports: layout, directory, users, items, interactions, drops.

        The directory is given relative to the repository root when it lies inside it,
        so checkpoints and result files carry no machine-specific paths.
        """
        try:
            where = str(Path(self.directory).resolve().relative_to(REPO_ROOT))
        except ValueError:
            where = str(self.directory)
        return dict(layout=self.layout, directory=where, users=self.n_users,
                    items=self.n_items, interactions=int(self.items.size),
                    dropped_users=self.dropped_users, dropped_ratings=self.dropped_ratings,
                    fingerprint=self.fingerprint())


@dataclass(frozen=True, eq=False)
class LeaveOneOut:
    """Leave-one-out split: last item for test, second-to-last for validation.

    Attributes
    ----------
    train_offsets : np.ndarray, shape (U + 1,), int64
        CSR offsets into ``train_items``.
    train_items : np.ndarray, shape (I - 2U,), int64
        Each user's sequence without its last two items, oldest first.
    valid_items : np.ndarray, shape (U,), int64
        Second-to-last item of each user.
    test_items : np.ndarray, shape (U,), int64
        Last item of each user.
    """

    train_offsets: np.ndarray
    train_items: np.ndarray
    valid_items: np.ndarray
    test_items: np.ndarray

    @property
    def n_users(self) -> int:
        return int(self.valid_items.size)

    def train_sequence(self, user: int) -> np.ndarray:
        """Training items of user row ``user``, shape (n_u - 2,), int64."""
        return self.train_items[self.train_offsets[user]:self.train_offsets[user + 1]]

    def history(self, user: int, stage: str) -> np.ndarray:
        """Items visible before the target of ``stage`` (``"valid"`` or ``"test"``).

        Returns
        -------
        np.ndarray, shape (h,), int64
            The training sequence, plus the validation item when ``stage == "test"``.
        """
        if stage == "valid":
            return self.train_sequence(user)
        if stage == "test":
            return np.append(self.train_sequence(user), self.valid_items[user])
        raise ZeroGRError(f"stage must be 'valid' or 'test', got {stage!r}")

    def targets(self, stage: str) -> np.ndarray:
        """Target item of every user for ``stage``; shape (U,), int64."""
        if stage == "valid":
            return self.valid_items
        if stage == "test":
            return self.test_items
        raise ZeroGRError(f"stage must be 'valid' or 'test', got {stage!r}")

    def train_counts(self, n_items: int) -> np.ndarray:
        """Training interactions per item; shape (n_items,), int64."""
        return np.bincount(self.train_items, minlength=n_items).astype(np.int64)


def leave_one_out(data: MovieLens) -> LeaveOneOut:
    """Split every user's chronological sequence into train / validation / test.

    Parameters
    ----------
    data : MovieLens
        Every user has at least three ratings (the loader guarantees it).

    Returns
    -------
    LeaveOneOut
    """
    ends = data.offsets[1:]
    lengths = np.diff(data.offsets)
    keep = np.ones(data.items.size, dtype=bool)
    keep[ends - 1] = False
    keep[ends - 2] = False
    train_offsets = np.concatenate([[0], np.cumsum(lengths - 2)]).astype(np.int64)
    return LeaveOneOut(train_offsets=train_offsets, train_items=data.items[keep],
                       valid_items=data.items[ends - 2], test_items=data.items[ends - 1])


def detect_layout(directory: Path) -> str:
    """Name the MovieLens layout found in ``directory``.

    Raises
    ------
    ZeroGRError
        The directory does not exist or holds none of the three layouts.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ZeroGRError(f"{directory}: MovieLens data directory not found")
    for layout, (ratings, movies) in LAYOUTS.items():
        if (directory / ratings).is_file() and (directory / movies).is_file():
            return layout
    wanted = "; ".join(f"{r} + {m}" for r, m in LAYOUTS.values())
    raise ZeroGRError(f"{directory}: no MovieLens layout found (expected one of: {wanted})")


def load_movielens(directory: str | Path | None = None) -> MovieLens:
    """Load MovieLens from ``directory`` (default: the bundled ml-latest-small).

    Parameters
    ----------
    directory : str or Path, optional
        A directory holding one of the three layouts (see the module docstring).

    Returns
    -------
    MovieLens

    Raises
    ------
    ZeroGRError
        Unknown layout, unreadable or malformed file (the message names the file), or no
        user left with three ratings.
    """
    if pl is None:
        raise ZeroGRError("the MovieLens loaders need Polars (pip install -r requirements.txt)")
    directory = Path(directory) if directory is not None else BUNDLED_DIR
    layout = detect_layout(directory)
    ratings_name, movies_name = LAYOUTS[layout]
    ratings_path, movies_path = directory / ratings_name, directory / movies_name
    try:
        if layout == "ml-latest-small":
            movies, ratings = _read_latest(movies_path, ratings_path)
        elif layout == "ml-1m":
            movies, ratings = _read_1m(movies_path, ratings_path)
        else:
            movies, ratings = _read_100k(movies_path, ratings_path)
    except (pl.exceptions.PolarsError, UnicodeDecodeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ZeroGRError(f"{directory}: cannot read {layout} files: {first}") from None
    return _assemble(layout, directory, movies, ratings, ratings_path, movies_path)


# ---------------------------------------------------------------------------- readers
def _read_latest(movies_path: Path, ratings_path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    movies = _read_named(movies_path, {"movieId": pl.Int64, "title": pl.Utf8, "genres": pl.Utf8})
    movies = movies.select(pl.col("movieId").alias("movie"), pl.col("title"),
                           pl.col("genres").str.split("|").alias("genres"))
    ratings = _read_named(ratings_path, {"userId": pl.Int64, "movieId": pl.Int64, "timestamp": pl.Int64})
    ratings = ratings.select(pl.col("userId").alias("user"), pl.col("movieId").alias("movie"),
                             pl.col("timestamp"))
    return movies, ratings


def _read_double_colon(path: Path, names: list[str], dtypes: list) -> pl.DataFrame:
    """Read a ``::``-separated Latin-1 file (ML-1M) into the named columns."""
    text = path.read_bytes().decode("latin-1").replace("::", "\t")
    frame = pl.read_csv(io.BytesIO(text.encode("utf-8")), separator="\t", has_header=False,
                        quote_char=None, new_columns=names,
                        schema_overrides=dict(zip(names, dtypes)))
    if frame.width != len(names):
        raise ZeroGRError(f"{path}: expected {len(names)} '::'-separated fields, got {frame.width}")
    return frame


def _read_1m(movies_path: Path, ratings_path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    movies = _read_double_colon(movies_path, ["movie", "title", "genres"], [pl.Int64, pl.Utf8, pl.Utf8])
    movies = movies.with_columns(pl.col("genres").str.split("|"))
    ratings = _read_double_colon(ratings_path, ["user", "movie", "rating", "timestamp"],
                                 [pl.Int64, pl.Int64, pl.Float64, pl.Int64])
    return movies, ratings.select("user", "movie", "timestamp")


def _read_100k(movies_path: Path, ratings_path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    flag_names = [f"g{i}" for i in range(len(ML100K_GENRES))]
    names = ["movie", "title", "release", "video_release", "url", *flag_names]
    text = movies_path.read_bytes().decode("latin-1")
    raw = pl.read_csv(io.BytesIO(text.encode("utf-8")), separator="|", has_header=False,
                      quote_char=None, new_columns=names, infer_schema=False)
    if raw.width != len(names):
        raise ZeroGRError(f"{movies_path}: expected {len(names)} '|'-separated fields, got {raw.width}")
    genre_lists = pl.concat_list([pl.when(pl.col(f) == "1").then(pl.lit(g)).otherwise(None)
                                  for f, g in zip(flag_names, ML100K_GENRES)]).list.drop_nulls()
    movies = raw.select(pl.col("movie").cast(pl.Int64), pl.col("title"), genre_lists.alias("genres"))
    ratings = pl.read_csv(ratings_path, separator="\t", has_header=False,
                          new_columns=["user", "movie", "rating", "timestamp"],
                          schema_overrides={"user": pl.Int64, "movie": pl.Int64, "rating": pl.Float64,
                                            "timestamp": pl.Int64})
    if ratings.width != 4:
        raise ZeroGRError(f"{ratings_path}: expected 4 tab-separated fields, got {ratings.width}")
    return movies, ratings.select("user", "movie", "timestamp")


def _read_named(path: Path, dtypes: dict) -> pl.DataFrame:
    """A CSV file with a header holding (at least) the columns of ``dtypes``, read with those types.

    The header is checked first: given as many types as the file has columns, Polars applies them
    by position, so a file of other column names (``id,name,kind``) was read as if it had these.
    """
    _require_columns(pl.read_csv(path, n_rows=0), tuple(dtypes), path)
    return pl.read_csv(path, schema_overrides=dtypes)


def _require_columns(frame: pl.DataFrame, columns: tuple[str, ...], path: Path) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ZeroGRError(f"{path}: missing column(s) {', '.join(missing)}")


def _assemble(layout: str, directory: Path, movies: pl.DataFrame, ratings: pl.DataFrame,
              ratings_path: Path, movies_path: Path) -> MovieLens:
    if movies.height == 0:
        raise ZeroGRError(f"{movies_path}: no movies")
    for frame, cols, path in ((movies, ["movie"], movies_path),
                              (ratings, ["user", "movie", "timestamp"], ratings_path)):
        for col in cols:
            nulls = frame[col].null_count()
            if nulls:
                raise ZeroGRError(f"{path}: {nulls} empty value(s) in column '{col}'")
    dup = movies.group_by("movie").len().filter(pl.col("len") > 1)
    if dup.height:
        raise ZeroGRError(f"{movies_path}: movie id {dup['movie'][0]} listed twice")
    movies = movies.sort("movie").with_row_index("item")
    known = ratings.join(movies.select("movie", "item"), on="movie", how="inner", maintain_order="left")
    dropped_ratings = ratings.height - known.height
    # Chronological per user; the file position breaks ties in time (stable order).
    known = known.with_row_index("pos").sort(["user", "timestamp", "pos"])
    counts = known.group_by("user", maintain_order=True).len()
    kept_users = counts.filter(pl.col("len") >= MIN_INTERACTIONS)
    if kept_users.height == 0:
        raise ZeroGRError(f"{ratings_path}: no user has {MIN_INTERACTIONS} or more ratings")
    known = known.join(kept_users.select("user"), on="user", how="semi", maintain_order="left")
    lengths = kept_users["len"].to_numpy().astype(np.int64)
    titles = np.empty(movies.height, dtype=object)
    titles[:] = [t if t is not None else "" for t in movies["title"].to_list()]
    genres = np.empty(movies.height, dtype=object)
    genres[:] = [tuple(g for g in (gs or []) if g and g != "(no genres listed)")
                 for gs in movies["genres"].to_list()]
    return MovieLens(
        layout=layout, directory=directory,
        item_ids=movies["movie"].to_numpy().astype(np.int64), titles=titles, genres=genres,
        user_ids=kept_users["user"].to_numpy().astype(np.int64),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        items=known["item"].to_numpy().astype(np.int64),
        timestamps=known["timestamp"].to_numpy().astype(np.int64),
        dropped_users=counts.height - kept_users.height, dropped_ratings=dropped_ratings)
