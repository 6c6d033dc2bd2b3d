"""A dense-retrieval two-tower baseline whose item tower reads item content only.

In the spirit of Hou et al. (2022, "Towards Universal Sequence Representation Learning for
Recommender Systems", UniSRec): items are represented from their content, not from an ID
embedding, so an item no one interacted with (a cold-start item) still gets a vector.
The content available for every Beauty item is its content semantic ID (RQ-KMeans codes
of a text embedding of the item's metadata), so an item's content vector is the sum of one
learned embedding per (level, code) of its SID, levels of the SID file only (a collision
level, which is ranked by interactions, is left out).

* **item tower**: content vector → a two-layer MLP with a residual → item vector;
* **user tower**: the content vectors of the newest ``max_items`` history items, as the
  newest item's vector and the mean of all of them → a two-layer MLP → user vector (a
  pooling tower rather than a recurrent one: it trains in minutes on a shared CPU);
* **score**: the cosine of the two vectors, divided by a temperature.

Training is next-item prediction on the warm training transitions (the same ones the
generative model learns from, :func:`~.seqrec.transitions`): a sampled softmax
cross-entropy over the batch's targets plus ``negatives`` warm items drawn uniformly per
step, *warm* items only, so a cold item is never even a negative. AdamW, seeded; the
epoch with the best validation NDCG@10 (full ranking over the warm items) is kept.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ZeroGRError


@dataclass(frozen=True)
class DenseConfig:
    """The two-tower baseline's architecture and training.

    Attributes
    ----------
    dim : int
        Width of the content, item and user vectors.
    max_items : int
        Newest history items the user tower reads.
    epochs : int
    batch_size : int
    lr : float
    weight_decay : float
    temperature : float
        Logits are ``cos(user, item) / temperature``.
    negatives : int or None
        Warm items drawn per step for the sampled softmax (None: every warm item).
    eval_users : int
        Validation users scored after every epoch (evenly spread).
    max_minutes : float or None
        Wall-clock budget of the training loop.
    seed : int
    """

    dim: int = 64
    max_items: int = 20
    epochs: int = 8
    batch_size: int = 2048
    lr: float = 5e-3
    weight_decay: float = 0.01
    temperature: float = 0.05
    negatives: int | None = 4096
    eval_users: int = 4000
    max_minutes: float | None = 3.0
    seed: int = 0

    @classmethod
    def preset(cls, name: str) -> "DenseConfig":
        """``"cpu"`` (a few minutes on two cores), ``"tiger"`` (the GPU study: wider and
        longer) or ``"tiny"`` (tests)."""
        if name == "cpu":
            return cls()
        if name == "tiger":
            return cls(dim=128, epochs=30, max_minutes=1.5)
        if name == "tiny":
            return cls(dim=16, max_items=3, epochs=2, batch_size=64, eval_users=50, max_minutes=None, negatives=None)
        raise ZeroGRError(f"unknown dense preset {name!r} (choose from cpu, tiger, tiny)")


class TwoTower(nn.Module):
    """Content item tower and pooling user tower (see the module docstring).

    Parameters
    ----------
    codes : np.ndarray, shape (N, L), int64
        Content SID of each catalog row.
    config : DenseConfig
    """

    def __init__(self, codes: np.ndarray, config: DenseConfig):
        super().__init__()
        sizes = [int(codes[:, level].max()) + 1 for level in range(codes.shape[1])]
        self.config = config
        self.register_buffer("codes", torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64)))
        self.code_emb = nn.ModuleList(nn.Embedding(size, config.dim) for size in sizes)
        self.item_mlp = nn.Sequential(nn.Linear(config.dim, 2 * config.dim), nn.GELU(),
                                      nn.Linear(2 * config.dim, config.dim))
        self.user_mlp = nn.Sequential(nn.Linear(2 * config.dim, 2 * config.dim), nn.GELU(),
                                      nn.Linear(2 * config.dim, config.dim))

    def content(self, rows: torch.Tensor) -> torch.Tensor:
        """Content vectors of catalog ``rows`` (any shape ``S``) → ``S + (dim,)``."""
        codes = self.codes[rows]
        return sum(emb(codes[..., level]) for level, emb in enumerate(self.code_emb))

    def item_vectors(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Item-tower vectors, unit length, shape (n, dim), float32 (every catalog row when
        ``rows`` is None)."""
        if rows is None:
            rows = torch.arange(self.codes.shape[0], device=self.codes.device)
        x = self.content(rows)
        return F.normalize(x + self.item_mlp(x), dim=-1)

    def user_vectors(self, rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """User-tower vectors.

        Parameters
        ----------
        rows : torch.Tensor, shape (B, T), int64
            History catalog rows, left-aligned (the newest last), anything past ``lengths``.
        lengths : torch.Tensor, shape (B,), int64, each in 1..T

        Returns
        -------
        torch.Tensor, shape (B, dim), float32
            Unit length.
        """
        lengths = lengths.to(rows.device)
        x = self.content(rows.clamp(min=0))
        inside = (torch.arange(rows.shape[1], device=rows.device)[None] < lengths[:, None]).to(x.dtype)
        mean = (x * inside[..., None]).sum(1) / lengths[:, None].to(x.dtype)
        newest = x[torch.arange(rows.shape[0], device=rows.device), lengths - 1]
        return F.normalize(self.user_mlp(torch.cat([newest, mean], dim=1)), dim=-1)


def _windows(histories: list[np.ndarray], max_items: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Newest ``max_items`` of each history, left-aligned and zero-padded; (B, T) rows, (B,) lengths."""
    cut = [h[-max_items:] for h in histories]
    lengths = np.asarray([c.size for c in cut], dtype=np.int64)
    if (lengths == 0).any():
        raise ZeroGRError("dense retrieval: every history needs at least one item")
    rows = np.zeros((len(cut), int(lengths.max())), dtype=np.int64)
    for i, c in enumerate(cut):
        rows[i, :c.size] = c
    return torch.from_numpy(rows), torch.from_numpy(lengths)


@torch.no_grad()
def dense_rank(model: TwoTower, histories: list[np.ndarray], candidates: np.ndarray, depth: int,
               batch_size: int = 1024) -> np.ndarray:
    """Rank ``candidates`` for every history by the two towers' dot product.

    Parameters
    ----------
    model : TwoTower
    histories : list of np.ndarray (h_u,) int64
        Catalog rows, oldest first, each non-empty.
    candidates : np.ndarray, shape (C,), int64
        Catalog rows that may be returned.
    depth : int
        List length (capped at C).

    Returns
    -------
    np.ndarray, shape (U, depth), int64
        Catalog rows best first; -1 past C.
    """
    model.eval()
    dev = model.codes.device
    cand = torch.from_numpy(np.asarray(candidates, dtype=np.int64)).to(dev)
    items = model.item_vectors(cand)
    take = min(depth, int(cand.numel()))
    out = np.full((len(histories), depth), -1, dtype=np.int64)
    for lo in range(0, len(histories), batch_size):
        rows, lengths = _windows(histories[lo:lo + batch_size], model.config.max_items)
        users = model.user_vectors(rows.to(dev), lengths)
        top = (users @ items.T).topk(take, dim=1).indices
        out[lo:lo + top.shape[0], :take] = cand[top].cpu().numpy()
    return out


def train_dense(config: DenseConfig, codes: np.ndarray, train_rows: np.ndarray, train_lengths: np.ndarray,
                train_targets: np.ndarray, warm_rows: np.ndarray, valid_histories: list[np.ndarray],
                valid_targets: np.ndarray, device: torch.device, log=print) -> tuple[TwoTower, dict]:
    """Train the two towers on warm next-item transitions.

    Parameters
    ----------
    config : DenseConfig
    codes : np.ndarray, shape (N, L), int64
        Content SID of every catalog row.
    train_rows : np.ndarray, shape (E, T), int64
        History windows (catalog rows, left-aligned), as :func:`~.seqrec.transitions` cuts them.
    train_lengths : np.ndarray, shape (E,), int64
    train_targets : np.ndarray, shape (E,), int64
        Target catalog rows, all warm.
    warm_rows : np.ndarray, shape (W,), int64
        The rows the softmax runs over (the warm items).
    valid_histories : list of np.ndarray
        Validation histories (catalog rows) of the selection users.
    valid_targets : np.ndarray, shape (V,), int64
    device : torch.device
    log : callable(str)

    Returns
    -------
    model : TwoTower
        The best epoch's weights, eval mode.
    record : dict
        ``config``, ``parameters``, per-epoch ``history`` (train loss, validation
        Recall@10 / NDCG@10 over the warm items, seconds), ``best_epoch``, ``seconds``.
    """
    from .quality import ranking_metrics

    if train_targets.size == 0:
        raise ZeroGRError("dense retrieval: no training transition")
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = TwoTower(codes, config).to(device)
    warm = torch.from_numpy(np.asarray(warm_rows, dtype=np.int64)).to(device)
    # Softmax classes are positions in ``warm``: map each target row to its position.
    position = torch.full((codes.shape[0],), -1, dtype=torch.int64)
    position[warm.cpu()] = torch.arange(warm.numel())
    targets = position[torch.from_numpy(train_targets)]
    if (targets < 0).any():
        raise ZeroGRError("dense retrieval: a training target is not among the warm items")
    width = min(config.max_items, train_rows.shape[1])
    # Keep the newest ``width`` items of each window, left-aligned.
    rows_np = np.zeros((train_rows.shape[0], width), dtype=np.int64)
    lengths_np = np.minimum(train_lengths, width)
    for i in range(train_rows.shape[0]):
        n = int(train_lengths[i])
        rows_np[i, :lengths_np[i]] = train_rows[i, n - lengths_np[i]:n]
    rows_t, lengths_t = torch.from_numpy(rows_np), torch.from_numpy(lengths_np)
    optim = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    budget = config.max_minutes * 60 if config.max_minutes is not None else float("inf")
    start = time.perf_counter()
    history, best, best_state = [], (-1.0, -1.0), None
    n = targets.numel()
    for epoch in range(1, config.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(n, generator=generator)
        running, seen, out_of_time = 0.0, 0, False
        for lo in range(0, n, config.batch_size):
            idx = order[lo:lo + config.batch_size]
            users = model.user_vectors(rows_t[idx].to(device), lengths_t[idx])
            if config.negatives is None or config.negatives >= warm.numel():
                classes, labels = warm, targets[idx].to(device)
            else:
                drawn = torch.randint(warm.numel(), (config.negatives,), generator=generator)
                picked, inverse = torch.unique(torch.cat([targets[idx], drawn]), return_inverse=True)
                classes, labels = warm[picked.to(device)], inverse[:idx.numel()].to(device)
            logits = users @ model.item_vectors(classes).T / config.temperature
            loss = F.cross_entropy(logits, labels)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            running += float(loss.detach()) * idx.numel()
            seen += idx.numel()
            if time.perf_counter() - start > budget:
                out_of_time = True
                break
        lists = dense_rank(model, valid_histories, warm.cpu().numpy(), 10)
        recall, ndcg = ranking_metrics(lists, valid_targets, [10])
        record = dict(epoch=epoch, train_loss=running / seen, transitions=seen, valid_recall=recall[10],
                      valid_ndcg=ndcg[10], seconds=time.perf_counter() - t0)
        history.append(record)
        log(f"dense epoch {epoch}: train loss {record['train_loss']:.4f}, warm validation Recall@10 "
            f"{recall[10]:.4f} NDCG@10 {ndcg[10]:.4f} ({record['seconds']:.0f} s)")
        if (ndcg[10], recall[10]) > best:
            best = (ndcg[10], recall[10])
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best_epoch = epoch
        if out_of_time:
            break
    model.load_state_dict(best_state)
    model.eval()
    return model, dict(config=asdict(config), parameters=sum(p.numel() for p in model.parameters()),
                       history=history, best_epoch=best_epoch, seconds=time.perf_counter() - start,
                       stopped="max_minutes" if out_of_time else "epochs")
