"""Semantic IDs for MovieLens items: embeddings from real signal, RQ-KMeans, collision level.

Item embeddings join two signals, each reduced by a truncated SVD and scaled to unit
length before weighting:

* **collaborative**: the training interactions only (no validation or test item leaks
  in), as a user × item matrix with each user's row scaled by 1/√(ratings); items that
  are co-rated by the same users get nearby vectors. Items with no training rating get
  a zero vector here.
* **content**: a TF-IDF bag of words per movie: its genres, the words of its title and
  its release decade.

Residual k-means (RQ-KMeans) quantises the joined vectors level by level: level ℓ runs
k-means (k-means++ seeding, Lloyd iterations, empty clusters re-seeded at the worst-fit
points) on the residuals left by levels < ℓ. Items that end with the same L codes get a
final *collision* level 0, 1, 2, …, so every SID is unique, as TIGER does. Within a group
the most-rated item (training ratings) gets 0, ties by ascending movie id, so token 0 is
the likeliest one everywhere.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..catalog import Catalog
from ..errors import ZeroGRError
from .data import LeaveOneOut, MovieLens


@dataclass(frozen=True)
class SIDConfig:
    """How semantic IDs are made.

    Attributes
    ----------
    levels : int
        RQ-KMeans levels L (the collision level comes on top).
    codebook_size : int
        k per level (capped at the number of distinct residuals).
    collab_dim, content_dim : int
        Truncated-SVD ranks of the two signals.
    collab_weight, content_weight : float
        Weights of the unit-length signals in the joined vector (0 drops a signal).
    kmeans_iters : int
        Maximum Lloyd iterations per level.
    seed : int
    """

    levels: int = 3
    codebook_size: int = 128
    collab_dim: int = 64
    content_dim: int = 32
    collab_weight: float = 1.0
    content_weight: float = 0.5
    kmeans_iters: int = 60
    seed: int = 0

    @classmethod
    def preset(cls, name: str) -> "SIDConfig":
        """Named presets: ``"shipped"`` (the study) and ``"tiny"`` (CI)."""
        presets = {
            "shipped": cls(),
            "tiny": cls(levels=2, codebook_size=8, collab_dim=8, content_dim=8, kmeans_iters=10),
        }
        if name not in presets:
            raise ZeroGRError(f"unknown SID preset {name!r} (choose from {', '.join(presets)})")
        return presets[name]


@dataclass(frozen=True, eq=False)
class SemanticIds:
    """The SIDs of a MovieLens catalog and how they came out.

    Attributes
    ----------
    codes : np.ndarray, shape (N, L + 1), int64
        SID of each item *index* (row order of :attr:`MovieLens.item_ids`); last column is
        the collision level.
    catalog : Catalog
        The same SIDs as a sorted project catalog with movie ids and titles.
    item_of_row : np.ndarray, shape (N,), int64
        Item index of each catalog row.
    row_of_item : np.ndarray, shape (N,), int64
        Catalog row of each item index (inverse of ``item_of_row``).
    config : SIDConfig
    """

    codes: np.ndarray
    catalog: Catalog
    item_of_row: np.ndarray
    row_of_item: np.ndarray
    config: SIDConfig

    def report(self) -> dict:
        """Codebook sizes, collision statistics and per-step catalog densities."""
        body = self.codes[:, :-1]
        _, inverse, counts = np.unique(body, axis=0, return_inverse=True, return_counts=True)
        shared = counts[inverse.ravel()] > 1
        return dict(
            codebook_sizes=list(self.catalog.codebook_sizes),
            collision_rate=float(shared.mean()),
            collision_groups=int((counts > 1).sum()),
            largest_collision_group=int(counts.max()),
            steps=self.catalog.step_stats(),
            config=asdict(self.config) if self.config is not None else None)


# ---------------------------------------------------------------------------- signals
def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    norms = x.norm(dim=1, keepdim=True)
    return torch.where(norms > 0, x / norms.clamp_min(1e-12), x)


def _truncated_svd(matrix: torch.Tensor, rank: int, seed: int) -> torch.Tensor:
    """Right factors scaled by singular values: (cols, rank') with rank' ≤ rank."""
    rank = min(rank, *matrix.shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _, s, v = torch.svd_lowrank(matrix, q=rank, niter=6)
    return v * s


def collaborative_embeddings(split: LeaveOneOut, n_items: int, dim: int, seed: int) -> torch.Tensor:
    """Item vectors from the training interactions only.

    Returns
    -------
    torch.Tensor, shape (n_items, dim'), float32
        Unit rows (zero rows for items without a training rating); dim' ≤ dim.
    """
    lengths = np.diff(split.train_offsets)
    users = np.repeat(np.arange(split.n_users), lengths)
    weights = 1.0 / np.sqrt(np.maximum(lengths, 1))[users]
    matrix = torch.sparse_coo_tensor(
        torch.from_numpy(np.stack([users, split.train_items])), torch.from_numpy(weights).float(),
        size=(split.n_users, n_items), check_invariants=True).coalesce()
    return _unit_rows(_truncated_svd(matrix, dim, seed))


_WORD = re.compile(r"[a-z0-9]+")
_YEAR = re.compile(r"\((\d{4})\)\s*$")


def content_tokens(title: str, genres: tuple[str, ...]) -> list[str]:
    """Bag of words of one movie: ``genre:*``, ``decade:*`` and lower-case title words."""
    tokens = [f"genre:{g.lower()}" for g in genres]
    year = _YEAR.search(title)
    if year:
        tokens.append(f"decade:{int(year.group(1)) // 10 * 10}")
        title = title[:year.start()]
    tokens.extend(f"word:{w}" for w in _WORD.findall(title.lower()))
    return sorted(set(tokens))


def content_embeddings(data: MovieLens, dim: int, seed: int) -> torch.Tensor:
    """Item vectors from a TF-IDF bag of title words, genres and decade.

    Tokens used by a single movie are dropped (they cannot group items), and so are tokens
    used by every movie (their IDF is 0, so they cannot tell items apart, and a movie with
    nothing else had a zero norm: NaN rows that failed the SVD).

    Returns
    -------
    torch.Tensor, shape (N, dim'), float32
        Unit rows (zero rows for movies without a shared token); dim' ≤ dim.
    """
    bags = [content_tokens(t, g) for t, g in zip(data.titles, data.genres)]
    vocab: dict[str, int] = {}
    rows, cols = [], []
    for item, bag in enumerate(bags):
        for tok in bag:
            rows.append(item)
            cols.append(vocab.setdefault(tok, len(vocab)))
    rows_a, cols_a = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    df = np.bincount(cols_a, minlength=len(vocab))
    keep = (df[cols_a] >= 2) & (df[cols_a] < data.n_items)
    if not keep.any():
        return torch.zeros(data.n_items, 1)
    idf = np.log(data.n_items / df).astype(np.float32)
    values = idf[cols_a[keep]]
    norms = np.sqrt(np.bincount(rows_a[keep], weights=values ** 2, minlength=data.n_items))
    values = values / norms[rows_a[keep]]
    matrix = torch.sparse_coo_tensor(
        torch.from_numpy(np.stack([cols_a[keep], rows_a[keep]])), torch.from_numpy(values).float(),
        size=(len(vocab), data.n_items), check_invariants=True).coalesce()
    # Columns are items here, so the right factors are the item vectors.
    return _unit_rows(_truncated_svd(matrix, dim, seed))


def item_embeddings(data: MovieLens, split: LeaveOneOut, config: SIDConfig) -> torch.Tensor:
    """Weighted join of the collaborative and content vectors; shape (N, d), float32."""
    parts = []
    if config.collab_weight > 0:
        parts.append(config.collab_weight * collaborative_embeddings(
            split, data.n_items, config.collab_dim, config.seed))
    if config.content_weight > 0:
        parts.append(config.content_weight * content_embeddings(data, config.content_dim, config.seed))
    if not parts:
        raise ZeroGRError("SID config: collab_weight and content_weight are both 0")
    return torch.cat(parts, dim=1)


# ---------------------------------------------------------------------------- RQ-KMeans
def kmeans(x: torch.Tensor, k: int, iters: int, generator: torch.Generator
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """k-means with k-means++ seeding; every cluster ends non-empty.

    Parameters
    ----------
    x : torch.Tensor, shape (n, d), float32
    k : int
        1 ≤ k ≤ number of distinct rows of ``x``.
    iters : int
        Maximum Lloyd iterations (stops early when assignments settle).
    generator : torch.Generator
        Source of randomness (seeding).

    Returns
    -------
    centroids : torch.Tensor, shape (k, d), float32
    assign : torch.Tensor, shape (n,), int64
    """
    n = x.shape[0]
    first = int(torch.randint(n, (1,), generator=generator))
    centroids = [x[first]]
    closest = ((x - x[first]) ** 2).sum(1)
    for _ in range(1, k):
        pick = int(torch.multinomial(closest / closest.sum(), 1, generator=generator))
        centroids.append(x[pick])
        closest = torch.minimum(closest, ((x - x[pick]) ** 2).sum(1))
    cent = torch.stack(centroids)
    assign = torch.full((n,), -1, dtype=torch.int64)
    for _ in range(iters):
        dist = torch.cdist(x, cent) ** 2
        new_assign = dist.argmin(1)
        counts = torch.bincount(new_assign, minlength=cent.shape[0])
        empty = torch.nonzero(counts == 0).flatten()
        if empty.numel():
            # Re-seed empty clusters at the points worst served by their centroid.
            fit = dist.gather(1, new_assign[:, None]).squeeze(1)
            worst = torch.argsort(fit, descending=True)[:empty.numel()]
            new_assign[worst] = empty
            counts = torch.bincount(new_assign, minlength=cent.shape[0])
        if torch.equal(new_assign, assign):
            break
        assign = new_assign
        sums = torch.zeros_like(cent).index_add_(0, assign, x)
        cent = sums / counts[:, None].clamp_min(1)
    return cent, assign


def rq_kmeans(x: torch.Tensor, levels: int, codebook_size: int, iters: int, seed: int
              ) -> tuple[np.ndarray, list[int]]:
    """Residual k-means codes.

    Parameters
    ----------
    x : torch.Tensor, shape (n, d), float32
    levels, codebook_size, iters, seed : int

    Returns
    -------
    codes : np.ndarray, shape (n, levels), int64
    sizes : list of int
        Codebook size per level: k capped at the distinct residual count, less any
        cluster left empty; every code of every level is used by at least one item.
    """
    generator = torch.Generator().manual_seed(seed)
    residual = x.clone()
    codes, sizes = [], []
    for _ in range(levels):
        distinct = torch.unique(residual, dim=0).shape[0]
        k = max(1, min(codebook_size, distinct))
        cent, assign = kmeans(residual, k, iters, generator)
        used, assign = torch.unique(assign, return_inverse=True)
        cent = cent[used]
        codes.append(assign.numpy())
        sizes.append(int(cent.shape[0]))
        residual = residual - cent[assign]
    return np.stack(codes, axis=1).astype(np.int64), sizes


def collision_level(codes: np.ndarray, priority: np.ndarray | None = None) -> np.ndarray:
    """Rank of each row among the rows with the same code tuple.

    Parameters
    ----------
    codes : np.ndarray, shape (n, L), int64
    priority : np.ndarray, shape (n,), optional
        Lower ranks go to higher priority; ties (and the default) keep row order.

    Returns
    -------
    np.ndarray, shape (n,), int64
    """
    n = codes.shape[0]
    keys = [np.arange(n)]
    if priority is not None:
        keys.append(-np.asarray(priority))
    order = np.lexsort(np.concatenate([np.stack(keys), codes.T[::-1]]))
    sorted_codes = codes[order]
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (sorted_codes[1:] != sorted_codes[:-1]).any(axis=1)
    starts = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - starts
    return rank


def build_semantic_ids(data: MovieLens, split: LeaveOneOut, config: SIDConfig,
                       name: str = "movielens") -> SemanticIds:
    """Embed, quantise and disambiguate every catalog item.

    Returns
    -------
    SemanticIds
    """
    emb = item_embeddings(data, split, config)
    body, sizes = rq_kmeans(emb, config.levels, config.codebook_size, config.kmeans_iters, config.seed)
    # The most-rated item of a group (training ratings only) gets collision token 0.
    extra = collision_level(body, split.train_counts(data.n_items))
    codes = np.concatenate([body, extra[:, None]], axis=1)
    sizes.append(int(extra.max()) + 1)
    return semantic_ids_from_codes(data, codes, sizes, config, name=name)


def semantic_ids_from_codes(data, codes: np.ndarray, sizes: list[int], config: SIDConfig | None,
                            name: str) -> SemanticIds:
    """Wrap unique SIDs of every item of ``data`` as :class:`SemanticIds`.

    Parameters
    ----------
    data : MovieLens or SequenceData
        ``item_ids`` ascending, ``titles``.
    codes : np.ndarray, shape (N, L), int64
        SID of each item index; rows are unique.
    sizes : list of int
        Codebook size per level.
    config : SIDConfig or None
        How the codes were made (``None``: given from outside).
    name : str
    """
    catalog = Catalog.from_sids(codes, sizes, item_ids=data.item_ids, titles=data.titles, name=name)
    item_of_row = np.searchsorted(data.item_ids, catalog.item_ids).astype(np.int64)
    row_of_item = np.empty_like(item_of_row)
    row_of_item[item_of_row] = np.arange(item_of_row.size)
    return SemanticIds(codes=codes, catalog=catalog, item_of_row=item_of_row,
                       row_of_item=row_of_item, config=config)
