"""Training the T5 recommender on sequence data sets (Amazon Beauty …), and its checkpoint.

:func:`train_sequences` loads the data (:mod:`.sequences`), splits it leave-one-out
(:func:`~zerogr_core.recsys.data.leave_one_out`), takes or builds the semantic IDs, and
trains :class:`~zerogr_core.recsys.t5.T5Recommender` teacher-forced on every training
transition (history = up to ``max_items`` previous items, target = the next one). AdamW
with linear warm-up then cosine decay, gradient clipping, seeded shuffles and init.
Every ``eval_every`` epochs it decodes a fixed subset of validation users by constrained
beam search (filtering first) and keeps the weights with the best NDCG@10 (Recall@10
breaks ties); training stops after ``patience`` evaluations without improvement, at the
last epoch, or when the wall-clock budget runs out. Test items are never seen before
the final report.

The checkpoint (one ``torch.save`` dict, loadable with ``weights_only=True``) holds the
preset, the state dict, the SID table and item id of every catalog row, and the data
fingerprint; :func:`load_sequence_checkpoint` restores a :class:`~.train.StudyModel`.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..catalog import Catalog
from ..errors import ZeroGRError
from .data import LeaveOneOut, leave_one_out
from .semantic_ids import SIDConfig
from .sequences import BEAUTY_DIR, SequenceData, load_dataset, load_sequences, sequence_semantic_ids
from .t5 import T5Config, T5Recommender
from .train import StudyModel, ValidityTables, fixed_users, read_checkpoint, resolve_device, rows_of_ids

CHECKPOINT_FORMAT = "zerogr-seqrec-1"
#: Where a checkpoint for the bundled Beauty data goes by default (shipped when trained).
BEAUTY_CHECKPOINT = BEAUTY_DIR / "model.pt"


@dataclass(frozen=True)
class SeqTrainConfig:
    """Optimisation and model-selection settings.

    Attributes
    ----------
    epochs : int
        Upper bound; early stopping and ``max_minutes`` may end sooner.
    batch_size : int
        Training transitions per step.
    lr : float
        Peak AdamW learning rate (after ``warmup_steps``, then cosine decay to 0 at the
        last epoch).
    weight_decay : float
        On matrices only (not on layer-norm scales).
    warmup_steps : int
    grad_clip : float
    recent_targets : int or None
        Train only on each user's newest ``recent_targets`` transitions (None: all).
    eval_every : int
        Epochs between validation decodes.
    eval_users : int
        Validation users decoded for model selection (evenly spread; all when larger).
    eval_beam : int
        Beam width of those decodes.
    patience : int
        Evaluations without a better validation NDCG@10 before stopping.
    max_minutes : float or None
        Wall-clock budget of the training loop (evaluations included).
    seed : int
    validity_weight : float
        Weight of the catalog-validity term, relative to the cross-entropy per token (0:
        off, the headline recipe). With it, every transition also teacher-forces one
        catalog item drawn uniformly under the same history, and the loss adds
        ``validity_weight · ½ (V_true + V_drawn)``, V = −log of the probability that every
        step along the item's prefix path stays inside the catalog (each level's softmax
        over its own codebook, as decoding scores it). 0.625 per token matches the
        MovieLens recipe's 2.5 on a sum over four levels. The history's ``train_loss`` is
        then the whole objective; ``valid_loss`` stays the plain cross-entropy.
    """

    epochs: int = 200
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.035
    warmup_steps: int = 1000
    grad_clip: float = 1.0
    recent_targets: int | None = None
    eval_every: int = 5
    eval_users: int = 4000
    eval_beam: int = 20
    patience: int = 4
    max_minutes: float | None = None
    seed: int = 0
    validity_weight: float = 0.0


@dataclass(frozen=True)
class SeqPreset:
    """Everything that defines a trained sequence model.

    Attributes
    ----------
    name : str
    model : T5Config
    train : SeqTrainConfig
    sid : SIDConfig
        Used only when the data comes without a SID file.
    """

    name: str
    model: T5Config
    train: SeqTrainConfig
    sid: SIDConfig = field(default_factory=lambda: SIDConfig(levels=3, codebook_size=256, collab_dim=64,
                                                             content_weight=0.0))

    @classmethod
    def preset(cls, name: str) -> "SeqPreset":
        """``"tiger"`` (the GPU recipe, TIGER's architecture), ``"cpu"`` (≤ 15 minutes on
        two CPU cores: a smaller T5 on each user's newest transitions) or ``"tiny"`` (tests)."""
        if name == "tiger":
            return cls("tiger", T5Config(), SeqTrainConfig(epochs=200, batch_size=512, lr=2e-3, warmup_steps=500,
                                                           eval_every=5, eval_users=4000, eval_beam=20, patience=4))
        if name == "cpu":
            return cls("cpu", T5Config(encoder_layers=2, decoder_layers=2, d_model=64, n_heads=4, d_kv=16, d_ff=256,
                                       dropout=0.1, max_items=4),
                       SeqTrainConfig(epochs=2, batch_size=256, lr=5e-3, warmup_steps=30, recent_targets=3,
                                      eval_every=1, eval_users=500, eval_beam=20, patience=2, max_minutes=13.0))
        if name == "tiny":
            return cls("tiny", T5Config(encoder_layers=1, decoder_layers=1, d_model=16, n_heads=2, d_kv=8, d_ff=32,
                                        dropout=0.0, max_items=3),
                       SeqTrainConfig(epochs=2, batch_size=16, lr=3e-3, warmup_steps=5, eval_every=1, eval_users=8,
                                      eval_beam=8, patience=2),
                       SIDConfig.preset("tiny"))
        raise ZeroGRError(f"unknown preset {name!r} (choose from tiger, cpu, tiny)")

    @classmethod
    def from_dict(cls, d: dict) -> "SeqPreset":
        return cls(d["name"], T5Config(**d["model"]), SeqTrainConfig(**d["train"]), SIDConfig(**d["sid"]))


# ---------------------------------------------------------------------------- examples
def transitions(split: LeaveOneOut, row_of_item: np.ndarray, max_items: int, recent: int | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every training transition as (history window, target), catalog rows.

    For a training sequence x of a user, target ``x[t]`` (t ≥ 1) comes with the history
    ``x[max(0, t - max_items):t]``; with ``recent`` only the newest ``recent`` targets of
    each user are kept.

    Returns
    -------
    rows : np.ndarray, shape (E, max_items), int64
        History rows, left-aligned, 0 past each length.
    lengths : np.ndarray, shape (E,), int64
    targets : np.ndarray, shape (E,), int64
    """
    rows, lengths, targets = [], [], []
    for user in range(split.n_users):
        seq = row_of_item[split.train_sequence(user)]
        first = 1 if recent is None else max(1, seq.size - recent)
        for t in range(first, seq.size):
            hist = seq[max(0, t - max_items):t]
            rows.append(np.pad(hist, (0, max_items - hist.size)))
            lengths.append(hist.size)
            targets.append(seq[t])
    if not targets:
        raise ZeroGRError("training data: no user has two or more training interactions")
    return np.stack(rows).astype(np.int64), np.asarray(lengths, np.int64), np.asarray(targets, np.int64)


def validation_scores(study: StudyModel, split: LeaveOneOut, row_of_item: np.ndarray, users: np.ndarray,
                      beam: int, batch_size: int = 256) -> dict:
    """Recall@10 and NDCG@10 (filtering first) of ``users``' validation items."""
    from .quality import decode_rows, ranking_metrics

    histories = [row_of_item[split.history(int(u), "valid")] for u in users]
    lists = decode_rows(study, histories, "filter-first", beam, batch_size)
    recall, ndcg = ranking_metrics(lists, row_of_item[split.valid_items[users]], [k for k in (5, 10) if k <= beam])
    top = max(recall)
    return dict(recall=recall[top], ndcg=ndcg[top], k=top)


@torch.no_grad()
def validation_loss(model: T5Recommender, sids: torch.Tensor, split: LeaveOneOut, row_of_item: np.ndarray,
                    users: np.ndarray, batch_size: int = 512) -> float:
    """Teacher-forced cross-entropy per token of ``users``' validation items."""
    model.eval()
    total, count = 0.0, 0
    for lo in range(0, users.size, batch_size):
        chunk = users[lo:lo + batch_size]
        ids, mask = model.encoder_inputs([row_of_item[split.history(int(u), "valid")] for u in chunk], sids)
        tgt = sids[torch.from_numpy(row_of_item[split.valid_items[chunk]]).to(sids.device)]
        total += float(model.loss(ids, mask, tgt)) * chunk.size
        count += chunk.size
    return total / count


def train_t5(preset: SeqPreset, split: LeaveOneOut, catalog: Catalog, row_of_item: np.ndarray,
             device: torch.device, log=print) -> tuple[T5Recommender, list[dict], dict]:
    """Train a fresh model; returns it (best validation weights, eval mode), the per-epoch
    history and the selection record (best epoch, its scores, why training stopped)."""
    tc = preset.train
    start = time.perf_counter()
    torch.manual_seed(tc.seed)
    np.random.seed(tc.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    generator = torch.Generator().manual_seed(tc.seed)
    model = T5Recommender(preset.model, catalog.codebook_sizes).to(device)
    sids = torch.from_numpy(catalog.sids.astype(np.int64)).to(device)
    study = StudyModel(model, catalog, sids, {})
    rows_np, lengths_np, targets_np = transitions(split, row_of_item, preset.model.max_items, tc.recent_targets)
    rows, lengths, targets = (torch.from_numpy(a).to(device) for a in (rows_np, lengths_np, targets_np))
    tables = ValidityTables(catalog, device) if tc.validity_weight > 0 else None
    n = targets.numel()
    log(f"{n} training transitions, model {model.describe()['parameters']:,} parameters on {device}")
    decay = [p for name, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for name, p in model.named_parameters() if p.dim() < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=tc.lr)
    total = math.ceil(n / tc.batch_size) * tc.epochs
    budget = tc.max_minutes * 60 if tc.max_minutes is not None else math.inf

    def lr_at(step: int) -> float:
        # Cosine over whichever ends first, the epochs or the wall-clock budget, so a
        # budgeted run still anneals; warm-up is linear.
        progress = min(1.0, max(step / total, (time.perf_counter() - start) / budget))
        return tc.lr * min(1.0, (step + 1) / tc.warmup_steps) * 0.5 * (1 + math.cos(math.pi * progress))

    eval_users = fixed_users(split.n_users, tc.eval_users)
    step = 0
    best = dict(epoch=0, ndcg=-1.0, recall=-1.0)
    best_state, since_best, stopped, history = None, 0, "epochs", []
    for epoch in range(1, tc.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(n, generator=generator)
        running, seen, out_of_time = torch.zeros((), device=device), 0, False
        for lo in range(0, n, tc.batch_size):
            idx_host = order[lo:lo + tc.batch_size]
            width = int(lengths_np[idx_host.numpy()].max())     # on the host: no device sync
            idx = idx_host.to(device)
            ids, mask = model.pack(rows[idx, :width], lengths[idx], sids)
            if tables is None:
                loss = model.loss(ids, mask, sids[targets[idx]])
            else:
                drawn = torch.randint(catalog.n_items, (idx.numel(),), generator=generator).to(device)
                loss, (true_bands, drawn_bands) = model.level_logits(ids, mask, sids[targets[idx]], sids[drawn])
                loss = loss + tc.validity_weight * 0.5 * (tables.invalid_loss(true_bands, targets[idx])
                                                          + tables.invalid_loss(drawn_bands, drawn))
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            lr = lr_at(step)
            for group in optim.param_groups:
                group["lr"] = lr
            optim.step()
            step += 1
            running += loss.detach() * idx.numel()
            seen += idx.numel()
            if time.perf_counter() - start > budget:
                out_of_time = True
                break
        record = dict(epoch=epoch, train_loss=float(running) / max(seen, 1), seconds=time.perf_counter() - t0,
                      transitions=seen, lr=lr)
        record["valid_loss"] = [validation_loss(model, sids, split, row_of_item, eval_users)]
        if epoch % tc.eval_every == 0 or epoch == tc.epochs or out_of_time:
            scores = validation_scores(study, split, row_of_item, eval_users, tc.eval_beam)
            record.update(valid_recall=scores["recall"], valid_ndcg=scores["ndcg"], valid_k=scores["k"])
            if (scores["ndcg"], scores["recall"]) > (best["ndcg"], best["recall"]):
                best = dict(epoch=epoch, ndcg=scores["ndcg"], recall=scores["recall"], k=scores["k"])
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                since_best = 0
            else:
                since_best += 1
        record["elapsed_s"] = time.perf_counter() - start
        history.append(record)
        log(f"epoch {epoch}: train loss {record['train_loss']:.4f}, valid loss {record['valid_loss'][0]:.4f}"
            + (f", valid Recall@{record['valid_k']} {record['valid_recall']:.4f} NDCG@{record['valid_k']} "
               f"{record['valid_ndcg']:.4f}" if "valid_ndcg" in record else "")
            + f" ({record['seconds']:.0f} s, {record['elapsed_s'] / 60:.1f} min in all)")
        if out_of_time or time.perf_counter() - start > budget:
            stopped = "max_minutes"
            break
        if since_best >= tc.patience:
            stopped = "patience"
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    best["stopped"] = stopped
    log(f"kept epoch {best['epoch']} (validation NDCG@{best.get('k', 10)} {best['ndcg']:.4f}); stopped by {stopped}")
    return model, history, best


# ---------------------------------------------------------------------------- entry points
def load_data(data: str | Path | None, sids: str | Path | None, dataset: str | None) -> SequenceData:
    """``--dataset NAME`` or ``--data PATH [--sids FILE]`` (exactly one of the two)."""
    if (data is None) == (dataset is None):
        raise ZeroGRError("give exactly one of --data PATH or --dataset NAME")
    if dataset is not None:
        if sids is not None:
            raise ZeroGRError("--sids goes with --data, not with --dataset (a named data set has its SIDs)")
        return load_dataset(dataset)
    return load_sequences(data, sids)


def train_sequences(data: SequenceData, out: str | Path, *, preset: str = "cpu", device=None,
                    max_minutes: float | None = None, seed: int | None = None,
                    validity_weight: float | None = None, log=print) -> dict:
    """Train on ``data`` and write the checkpoint ``out``.

    Parameters
    ----------
    data : SequenceData
    out : str or Path
    preset : {"tiger", "cpu", "tiny"}
    device : str or torch.device, optional
        Default: CUDA when available, else CPU.
    max_minutes, seed, validity_weight : optional
        Override the preset's wall-clock budget, seed and validity-term weight.

    Returns
    -------
    dict
        The checkpoint's metadata (everything but the state dict and SID table).
    """
    from dataclasses import replace

    config = SeqPreset.preset(preset)
    overrides = {k: v for k, v in (("max_minutes", max_minutes), ("seed", seed), ("validity_weight", validity_weight))
                 if v is not None}
    if overrides:
        config = replace(config, train=replace(config.train, **overrides))
    if config.train.max_minutes is not None and config.train.max_minutes <= 0:
        raise ZeroGRError(f"--max-minutes must be > 0, got {config.train.max_minutes}")
    if not config.train.validity_weight >= 0:
        raise ZeroGRError(f"--validity-weight must be ≥ 0, got {config.train.validity_weight}")
    dev = resolve_device(device)
    out = Path(out)
    start = time.perf_counter()
    split = leave_one_out(data)
    log(f"{data.layout} {data.directory}: {data.n_users} users, {data.n_items} items, {data.items.size} "
        f"interactions ({data.dropped_users} users with < 3 dropped)")
    sid = sequence_semantic_ids(data, split, config.sid)
    sid_report = sid.report()
    source = f"from {data.sid_file}" if data.sid_file else "RQ-KMeans on training interactions"
    densities = " ".join(f"{step['density']:.4f}" for step in sid_report["steps"])
    log(f"semantic IDs ({source}): codebooks {'/'.join(map(str, sid_report['codebook_sizes']))}, "
        f"step densities {densities}")
    train_start = time.perf_counter()
    model, history, best = train_t5(config, split, sid.catalog, sid.row_of_item, dev, log=log)
    import transformers

    meta = dict(format=CHECKPOINT_FORMAT, study=asdict(config), codebook_sizes=list(sid.catalog.codebook_sizes),
                data=data.summary(), sid_report=sid_report, sid_source="file" if data.sid_file else "rq-kmeans",
                history=history, selection=best, train_seconds=time.perf_counter() - train_start,
                device=str(dev), torch=str(torch.__version__), transformers=transformers.__version__,
                total_seconds=time.perf_counter() - start)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(meta, state_dict={k: v.detach().cpu() for k, v in model.state_dict().items()},
                    sids=torch.from_numpy(sid.catalog.sids.astype(np.int64)),
                    item_ids=torch.from_numpy(np.asarray(sid.catalog.item_ids, dtype=np.int64))), out)
    log(f"wrote {out} ({meta['train_seconds'] / 60:.1f} min of training)")
    return meta


def load_sequence_checkpoint(path: str | Path, device=None) -> StudyModel:
    """Restore a checkpoint written by :func:`train_sequences`.

    Raises
    ------
    ZeroGRError
        Missing, unreadable or foreign file.
    """
    path = Path(path)
    blob = read_checkpoint(path, CHECKPOINT_FORMAT)
    state, sids, item_ids = blob.pop("state_dict"), blob.pop("sids"), blob.pop("item_ids")
    catalog = Catalog.from_sids(sids.numpy(), blob["codebook_sizes"], item_ids=item_ids.numpy(),
                                titles=[str(int(i)) for i in item_ids], name=Path(blob["data"]["directory"]).stem,
                                assume_sorted=True)
    dev = resolve_device(device)
    config = SeqPreset.from_dict(blob["study"])
    model = T5Recommender(config.model, catalog.codebook_sizes)
    model.load_state_dict(state)
    model.to(dev).eval()
    return StudyModel(model, catalog, torch.from_numpy(catalog.sids.astype(np.int64)).to(dev), blob)


def rows_for(study: StudyModel, data: SequenceData, path) -> np.ndarray:
    """Catalog row of every item index of ``data``, after checking it is the training data."""
    if data.fingerprint() != study.meta["data"]["fingerprint"]:
        raise ZeroGRError(f"{data.directory}: fingerprint {data.fingerprint()} differs from checkpoint {path}'s "
                          f"{study.meta['data']['fingerprint']} ({study.meta['data']['directory']}); the model "
                          f"was trained on other data")
    return rows_of_ids(study.catalog, data.item_ids)
