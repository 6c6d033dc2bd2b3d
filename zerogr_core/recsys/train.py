"""Training the MovieLens recommender, and its checkpoint file.

One call, :func:`train_movielens`, loads the data, splits it, builds semantic IDs from
the training interactions, trains the model teacher-forced with per-level cross-entropy
(AdamW, linear warm-up then cosine decay, seeded), records validation and test metrics
on a fixed subset of users, and writes the checkpoint and the SID catalog.

The checkpoint (``torch.save`` of a dict) holds the state dict, every configuration, the
SID catalog's file name (relative to the checkpoint) and SHA-256, the data fingerprint and
the recorded metrics. :func:`load_checkpoint` restores the model and its catalog.
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..catalog import Catalog, lcp_with_previous
from ..devices import as_device
from ..errors import ZeroGRError
from .data import LeaveOneOut, MovieLens, leave_one_out, load_movielens
from .model import ModelConfig, SIDRecommender, pack_histories
from .semantic_ids import SIDConfig, build_semantic_ids

CHECKPOINT_FORMAT = "zerogr-movielens-1"
BUNDLED_CHECKPOINT = Path(__file__).resolve().parents[2] / "sample_catalogs" / "movielens" / "model.pt"


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings.

    Attributes
    ----------
    epochs : int
    batch_size : int
        History windows per step (each window has up to ``max_history`` targets).
    lr : float
        Peak AdamW learning rate.
    weight_decay : float
    warmup_steps : int
    grad_clip : float
        Max gradient norm.
    validity_weight : float
        Weight of the catalog-validity term (0 turns it off). For every training
        position a catalog item is drawn uniformly and teacher-forced under the same
        history; the term is −log(probability that every step along that item's prefix
        path puts its mass on valid tokens), i.e. the sum over levels ≥ 2 of −log(valid
        mass), averaged with the same term on the true next items' prefixes. It teaches the model where the
        catalog is, long tail included, without favouring any item: all valid tokens
        share the credit.
    seed : int
    """

    epochs: int = 20
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 100
    grad_clip: float = 1.0
    validity_weight: float = 2.5
    validity_share: float = 0.5
    recent_items: int = 200
    seed: int = 0


@dataclass(frozen=True)
class StudyConfig:
    """Everything that defines a trained study model.

    Attributes
    ----------
    name : str
        Preset name.
    sid : SIDConfig
    model : ModelConfig
    train : TrainConfig
    eval_users : int
        Size of the fixed user subset whose metrics the checkpoint records.
    eval_beam : int
        Beam width of those recorded metrics.
    """

    name: str
    sid: SIDConfig
    model: ModelConfig
    train: TrainConfig
    eval_users: int = 32
    eval_beam: int = 128

    @classmethod
    def preset(cls, name: str) -> "StudyConfig":
        """``"shipped"`` (the bundled checkpoint) or ``"tiny"`` (trains in seconds, for CI)."""
        if name == "shipped":
            return cls("shipped", SIDConfig.preset("shipped"), ModelConfig.preset("shipped"), TrainConfig())
        if name == "tiny":
            return cls("tiny", SIDConfig.preset("tiny"), ModelConfig.preset("tiny"),
                       TrainConfig(epochs=2, batch_size=16, lr=3e-3, warmup_steps=5),
                       eval_users=8, eval_beam=16)
        raise ZeroGRError(f"unknown study preset {name!r} (choose from shipped, tiny)")

    @classmethod
    def from_dict(cls, d: dict) -> "StudyConfig":
        return cls(d["name"], SIDConfig(**d["sid"]), ModelConfig(**d["model"]), TrainConfig(**d["train"]),
                   d["eval_users"], d["eval_beam"])


@dataclass(frozen=True, eq=False)
class StudyModel:
    """A trained model with the catalog and data mapping it decodes against.

    Attributes
    ----------
    model : SIDRecommender
        In eval mode.
    catalog : Catalog
        The SID catalog; the model's item space is its rows.
    sids : torch.Tensor, shape (N, L), int64
        ``catalog.sids`` on the model's device.
    meta : dict
        The checkpoint dict without the state dict.
    """

    model: SIDRecommender
    catalog: Catalog
    sids: torch.Tensor
    meta: dict

    def rows_of_items(self, data: MovieLens) -> np.ndarray:
        """Catalog row of every item index of ``data``; shape (N,), int64.

        Raises
        ------
        ZeroGRError
            ``data`` is not the data set the model was trained on.
        """
        if data.fingerprint() != self.meta["data"]["fingerprint"]:
            raise ZeroGRError(
                f"--data {data.directory}: fingerprint {data.fingerprint()} differs from the checkpoint's "
                f"{self.meta['data']['fingerprint']} ({self.meta['data']['directory']}); train a model on "
                f"it with train-movielens --data {data.directory} --out FILE")
        return rows_of_ids(self.catalog, data.item_ids)


def rows_of_ids(catalog: Catalog, item_ids: np.ndarray) -> np.ndarray:
    """Catalog row of each of ``item_ids`` (all present in ``catalog``); shape (n,), int64."""
    order = np.argsort(catalog.item_ids)
    return order[np.searchsorted(catalog.item_ids, item_ids, sorter=order)].astype(np.int64)


# ---------------------------------------------------------------------------- windows
def training_windows(split: LeaveOneOut, row_of_item: np.ndarray, length: int, recent: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut each user's newest training transitions into next-item windows.

    Only the last ``recent`` transitions of a user are targets (as SASRec trains on the
    newest items). Window inputs are ``x[a:e]`` and targets ``x[a+1:e+1]`` with
    ``e - a ≤ length``; windows tile the kept part from its end, so each kept transition
    is a target exactly once.

    Returns
    -------
    inputs, targets : np.ndarray, shape (W, length), int64
        Catalog rows, -1 past each window's length.
    lengths : np.ndarray, shape (W,), int64
    """
    inputs, targets, lengths = [], [], []
    for user in range(split.n_users):
        seq = row_of_item[split.train_sequence(user)][-(recent + 1):]
        end = seq.size - 1
        while end > 0:
            start = max(0, end - length)
            inputs.append(seq[start:end])
            targets.append(seq[start + 1:end + 1])
            lengths.append(end - start)
            end = start
    n = len(lengths)
    inp = np.full((n, length), -1, dtype=np.int64)
    tgt = np.full((n, length), -1, dtype=np.int64)
    for w in range(n):
        inp[w, :lengths[w]] = inputs[w]
        tgt[w, :lengths[w]] = targets[w]
    return inp, tgt, np.asarray(lengths, dtype=np.int64)


def level_losses(logits: list[torch.Tensor], target_sids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per level.

    Parameters
    ----------
    logits : list of torch.Tensor, level l: (n, |V_l|)
    target_sids : torch.Tensor, shape (n, L), int64

    Returns
    -------
    torch.Tensor, shape (L,), float32
    """
    return torch.stack([F.cross_entropy(lg.float(), target_sids[:, level])
                        for level, lg in enumerate(logits)])


class ValidityTables:
    """Dense valid-next-token tables of a catalog, for the validity term of training.

    Parameters
    ----------
    catalog : Catalog
    device : torch.device

    Attributes
    ----------
    states : list of torch.Tensor
        ``states[l]`` (N,) int64: the state (distinct length-l prefix) of every row, l ≥ 1.
    valid : list of torch.Tensor
        ``valid[l]`` (S_l, |V_l|) bool: tokens valid after each state.
    """

    def __init__(self, catalog: Catalog, device: torch.device):
        sids = catalog.sids.astype(np.int64)
        h = lcp_with_previous(catalog.sids)
        self.states, self.valid = [None], [None]
        for level in range(1, catalog.n_levels):
            state = np.cumsum(h < level) - 1           # rows are sorted: a new prefix opens where h < l
            table = np.zeros((int(state[-1]) + 1, catalog.codebook_sizes[level]), dtype=bool)
            table[state, sids[:, level]] = True
            self.states.append(torch.from_numpy(state).to(device))
            self.valid.append(torch.from_numpy(table).to(device))

    def invalid_loss(self, logits: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """−log of the valid mass, summed over levels ≥ 2, after the prefixes of ``rows``.

        The sum is −log of the probability that every step along the row's prefix path
        stays inside the catalog.

        Parameters
        ----------
        logits : list of torch.Tensor, level l: (n, |V_l|)
        rows : torch.Tensor, shape (n,), int64
            Catalog rows whose prefixes were teacher-forced.

        Returns
        -------
        torch.Tensor, scalar
            Mean over the n rows.
        """
        total = logits[0].new_zeros((), dtype=torch.float32)
        for level in range(1, len(logits)):
            lg = logits[level].float()
            valid = self.valid[level][self.states[level][rows]]
            total = total + (lg.logsumexp(-1) - lg.masked_fill(~valid, float("-inf")).logsumexp(-1)).mean()
        return total


@torch.no_grad()
def next_item_loss(model: SIDRecommender, sids: torch.Tensor, histories: list[np.ndarray],
                   targets: np.ndarray, batch_size: int = 256) -> list[float]:
    """Per-level cross-entropy of ``targets`` given ``histories`` (catalog rows).

    Returns
    -------
    list of float, length L
    """
    total = torch.zeros(model.n_levels, dtype=torch.float64)
    for lo in range(0, len(histories), batch_size):
        hist, lengths = pack_histories(histories[lo:lo + batch_size], model.config.max_history)
        tgt = sids[torch.from_numpy(targets[lo:lo + batch_size]).to(sids.device)]
        fn = model.hidden_fn_for(histories[lo:lo + batch_size], sids)
        logits = [fn(level, tgt[:, None, :level])[:, 0] @ model.heads[level].T for level in range(model.n_levels)]
        total += level_losses(logits, tgt).double().cpu() * tgt.shape[0]
    return (total / len(histories)).tolist()


# ---------------------------------------------------------------------------- training
def train_model(config: StudyConfig, split: LeaveOneOut, catalog: Catalog, row_of_item: np.ndarray,
                device: torch.device, log=print) -> tuple[SIDRecommender, list[dict]]:
    """Teacher-forced training of a fresh model.

    Parameters
    ----------
    config : StudyConfig
    split : LeaveOneOut
    catalog : Catalog
    row_of_item : np.ndarray, shape (N,), int64
        Catalog row of each item index.
    device : torch.device
    log : callable(str)
        Progress lines (one per epoch).

    Returns
    -------
    model : SIDRecommender
        In eval mode.
    history : list of dict
        Per epoch: ``epoch``, ``train_loss`` (the objective per target: cross-entropy
        summed over levels plus the weighted validity term), ``valid_loss`` (validation
        cross-entropy per level), ``seconds``.
    """
    tc = config.train
    torch.manual_seed(tc.seed)
    generator = torch.Generator().manual_seed(tc.seed)
    model = SIDRecommender(config.model, catalog).to(device)
    sids = torch.from_numpy(catalog.sids.astype(np.int64)).to(device)
    inputs, targets, lengths = training_windows(split, row_of_item, config.model.max_history, tc.recent_items)
    if inputs.shape[0] == 0:
        raise ZeroGRError("training data: no user has two or more training ratings")
    inputs_t, targets_t = torch.from_numpy(inputs), torch.from_numpy(targets)
    tables = ValidityTables(catalog, device) if tc.validity_weight > 0 else None
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=tc.lr)
    steps_per_epoch = math.ceil(inputs.shape[0] / tc.batch_size)
    total_steps = steps_per_epoch * tc.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / tc.warmup_steps) * 0.5 * (
        1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    valid_hist = [row_of_item[split.history(u, "valid")] for u in range(split.n_users)]
    valid_tgt = row_of_item[split.valid_items]
    history = []
    for epoch in range(tc.epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(inputs.shape[0], generator=generator)
        running, count = 0.0, 0
        for lo in range(0, order.numel(), tc.batch_size):
            idx = order[lo:lo + tc.batch_size]
            width = int(lengths[idx.numpy()].max())
            inp = inputs_t[idx, :width].to(device)
            tgt = targets_t[idx, :width].to(device)
            mask = tgt >= 0
            prefix_sets = [sids[tgt.clamp(min=0)]]
            if tables is not None:
                n_drawn = max(1, round(tc.validity_share * idx.numel()))
                drawn = torch.randint(catalog.n_items, (n_drawn, width), generator=generator).to(device)
                prefix_sets.append(sids[drawn])
            outputs = model(sids[inp.clamp(min=0)], *prefix_sets)
            loss = level_losses([lg[mask] for lg in outputs[0]], sids[tgt[mask]]).sum()
            if tables is not None:
                keep = mask[:n_drawn]
                loss = loss + tc.validity_weight * 0.5 * (
                    tables.invalid_loss([lg[mask] for lg in outputs[0]], tgt[mask])
                    + tables.invalid_loss([lg[keep] for lg in outputs[1]], drawn[keep]))
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optim.step()
            schedule.step()
            running += loss.item() * int(mask.sum())
            count += int(mask.sum())
        valid = next_item_loss(model, sids, valid_hist, valid_tgt)
        record = dict(epoch=epoch + 1, train_loss=running / count, valid_loss=valid,
                      seconds=time.perf_counter() - start)
        history.append(record)
        log(f"epoch {epoch + 1}/{tc.epochs}: train loss {record['train_loss']:.3f}, valid loss per level "
            f"{' '.join(f'{v:.3f}' for v in valid)} ({record['seconds']:.1f} s)")
    model.eval()
    return model, history


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def fixed_users(n_users: int, count: int) -> np.ndarray:
    """``count`` user rows spread evenly over ``0 … n_users-1`` (all of them if fewer); int64."""
    if count >= n_users:
        return np.arange(n_users, dtype=np.int64)
    return np.unique(np.linspace(0, n_users - 1, count).round().astype(np.int64))


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"`` → CUDA when available, else CPU; otherwise ``device`` checked
    (:func:`zerogr_core.devices.as_device`)."""
    return as_device(device, "--device")


def train_movielens(data_dir: str | Path | None, out: str | Path, *, catalog_path: str | Path | None = None,
                    preset: str = "shipped", device: str | torch.device | None = None, log=print) -> dict:
    """Train the study model on MovieLens and write the checkpoint and the SID catalog.

    Parameters
    ----------
    data_dir : str or Path, optional
        A MovieLens directory (default: the bundled ml-latest-small).
    out : str or Path
        Checkpoint file to write.
    catalog_path : str or Path, optional
        SID catalog CSV to write (default: :func:`default_catalog_path` of ``out``).
    preset : {"shipped", "tiny"}
    device : str or torch.device, optional
        Default: CUDA when available, else CPU.
    log : callable(str)

    Returns
    -------
    dict
        The checkpoint's metadata (everything but the state dict).
    """
    from ..catalog.io import save_catalog

    config = StudyConfig.preset(preset)
    dev = resolve_device(device)
    out = Path(out)
    catalog_path = Path(catalog_path) if catalog_path is not None else default_catalog_path(out)
    if catalog_path.suffix.lower() != ".csv":
        raise ZeroGRError(f"--catalog {catalog_path}: the SID catalog is written as .csv")
    start = time.perf_counter()
    data = load_movielens(data_dir)
    split = leave_one_out(data)
    log(f"{data.layout} from {data.directory}: {data.n_users} users, {data.n_items} items, "
        f"{data.items.size} ratings ({data.dropped_users} users with < 3 ratings and "
        f"{data.dropped_ratings} ratings of unlisted movies dropped)")
    sids = build_semantic_ids(data, split, config.sid, name=f"{data.layout}-sids")
    sid_report = sids.report()
    densities = " ".join(f"{step['density']:.4f}" for step in sid_report["steps"])
    log(f"semantic IDs: codebooks {'/'.join(map(str, sid_report['codebook_sizes']))}, collision rate "
        f"{sid_report['collision_rate']:.3f}, step densities {densities}")
    train_start = time.perf_counter()
    model, history = train_model(config, split, sids.catalog, sids.row_of_item, dev, log=log)
    train_seconds = time.perf_counter() - train_start
    meta = dict(format=CHECKPOINT_FORMAT, study=asdict(config), codebook_sizes=list(sids.catalog.codebook_sizes),
                data=data.summary(), sid_report=sid_report, history=history, train_seconds=train_seconds,
                device=str(dev), torch=str(torch.__version__))
    study = StudyModel(model, sids.catalog, torch.from_numpy(sids.catalog.sids.astype(np.int64)).to(dev), meta)
    from .quality import KS, evaluate

    users = fixed_users(split.n_users, config.eval_users)
    ks = [k for k in KS if k <= config.eval_beam]
    meta["recorded"] = dict(users=users.tolist(), beam=config.eval_beam, ks=ks)
    for stage in ("valid", "test"):
        meta["recorded"][stage] = evaluate(study, split, users, stage, sids.row_of_item, beam=config.eval_beam,
                                           ks=ks, measure_invalid=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    catalog_path.parent.mkdir(parents=True, exist_ok=True)
    save_catalog(sids.catalog, catalog_path)
    meta["catalog"] = dict(file=_relpath(catalog_path, out.parent), sha256=file_sha256(catalog_path))
    meta["total_seconds"] = time.perf_counter() - start
    torch.save(dict(meta, state_dict={k: v.detach().cpu() for k, v in model.state_dict().items()}), out)
    rec = meta["recorded"]["test"]
    log(f"wrote {out} and {catalog_path}: trained in {train_seconds:.0f} s; on {len(users)} fixed users, "
        f"test Recall@10 {rec['recall_filter_first'].get('10', float('nan')):.3f} (filter first) / "
        f"{rec['recall_score_first'].get('10', float('nan')):.3f} (score first)")
    return meta


def default_catalog_path(out: str | Path) -> Path:
    """Where ``train-movielens --out FILE`` writes its SID catalog without ``--catalog``.

    ``<stem>.sid_catalog.csv`` beside ``out``, so two models trained into one folder keep one catalog
    each; the bundled checkpoint keeps the bundled ``sid_catalog.csv``, which the samples and the
    app open by name.
    """
    out = Path(out)
    if out.resolve() == BUNDLED_CHECKPOINT.resolve():
        return BUNDLED_CHECKPOINT.with_name("sid_catalog.csv")
    return out.with_name(f"{out.stem}.sid_catalog.csv")


def _relpath(path: Path, base: Path) -> str:
    return os.path.relpath(path.resolve(), base.resolve())


def read_checkpoint(path: Path, fmt: str, what: str = "checkpoint") -> dict:
    """The dict saved in checkpoint ``path`` (tensors on the CPU), checked to be of format ``fmt``.

    ``what`` names the kind of file in the error messages (e.g. ``"training state"``).

    Raises
    ------
    ZeroGRError
        Missing, unreadable or foreign file.
    """
    if not path.is_file():
        raise ZeroGRError(f"{path}: {what} not found")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for foreign files
        raise ZeroGRError(f"{path}: not a readable {what} ({type(exc).__name__})") from None
    if not isinstance(blob, dict) or blob.get("format") != fmt:
        raise ZeroGRError(f"{path}: not a {fmt} {what}")
    return blob


def load_checkpoint(path: str | Path | None = None, device: str | torch.device | None = "cpu") -> StudyModel:
    """Restore a checkpoint written by :func:`train_movielens` with its SID catalog.

    Parameters
    ----------
    path : str or Path, optional
        Default: the bundled ``sample_catalogs/movielens/model.pt``.
    device : str or torch.device, optional
        Where the model goes (default CPU; ``"auto"`` picks CUDA when available).

    Raises
    ------
    ZeroGRError
        Missing or foreign file, missing or modified SID catalog.
    """
    from ..catalog.io import load_catalog

    path = Path(path) if path is not None else BUNDLED_CHECKPOINT
    blob = read_checkpoint(path, CHECKPOINT_FORMAT)
    state = blob.pop("state_dict")
    catalog_file = path.parent / blob["catalog"]["file"]
    if not catalog_file.is_file():
        raise ZeroGRError(f"{path}: its SID catalog {catalog_file} is missing")
    if file_sha256(catalog_file) != blob["catalog"]["sha256"]:
        raise ZeroGRError(f"{catalog_file}: SID catalog differs from the one {path} was trained with")
    catalog = load_catalog(catalog_file, codebook_sizes=blob["codebook_sizes"])
    dev = resolve_device(device)
    config = StudyConfig.from_dict(blob["study"])
    model = SIDRecommender(config.model, catalog)
    model.load_state_dict(state)
    model.to(dev).eval()
    return StudyModel(model, catalog, torch.from_numpy(catalog.sids.astype(np.int64)).to(dev), blob)
