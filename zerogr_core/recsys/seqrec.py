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

A run may span several calls (a lent GPU allows ten minutes per command): with a
:class:`RunControl` the loop writes a training state after every epoch (model, AdamW, the
shuffle, torch, CUDA and NumPy RNG states, history, best record and weights, training
seconds so far), stops between epochs when the call's time is up, and a later call
resumes it. The learning rate depends only on the global step and on the training seconds
summed over calls, so the split run follows the uninterrupted run's schedule.

The checkpoint (one ``torch.save`` dict, loadable with ``weights_only=True``) holds the
preset, the state dict, the SID table and item id of every catalog row, and the data
fingerprint; :func:`load_sequence_checkpoint` restores a :class:`~.train.StudyModel`.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..catalog import Catalog
from ..errors import ZeroGRError, first_line
from .data import LeaveOneOut, leave_one_out
from .semantic_ids import SIDConfig
from .sequences import BEAUTY_DIR, SequenceData, load_dataset, load_sequences, sequence_semantic_ids
from .t5 import T5Config, T5Recommender
from .train import StudyModel, ValidityTables, fixed_users, read_checkpoint, resolve_device, rows_of_ids

CHECKPOINT_FORMAT = "zerogr-seqrec-1"
STATE_FORMAT = "zerogr-seqrec-state-1"
#: Where a checkpoint for the bundled Beauty data goes by default (shipped when trained).
BEAUTY_CHECKPOINT = BEAUTY_DIR / "model.pt"


#: Names of :meth:`SeqPreset.preset`.
PRESETS = ("tiger", "tiger-paper", "cpu", "tiny")
#: Learning-rate schedules of :class:`SeqTrainConfig`.
SCHEDULES = ("cosine", "inverse-sqrt")


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
        Peak AdamW learning rate (reached after ``warmup_steps``).
    schedule : {"cosine", "inverse-sqrt"}
        ``"cosine"``: a linear warm-up over ``warmup_steps``, then cosine decay to 0 at the
        last epoch or at the end of ``max_minutes``, whichever comes first.
        ``"inverse-sqrt"`` (T5's and TIGER's): ``lr`` for the first ``warmup_steps``, then
        ``lr · sqrt(warmup_steps / step)``; a ``max_minutes`` budget only stops it.
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
    skip_seen : bool
        Validation decodes leave out each user's history items, as the test report does
        by default (``quality --seen skip``).
    max_minutes : float or None
        Wall-clock budget of the training loop (evaluations included).
    seed : int
    amp : {None, "bf16"}
        Autocast dtype of the training forward passes, CUDA only: None keeps FP32 (TF32
        matmuls on CUDA), ``"bf16"`` runs them in bfloat16; parameters, gradients, the loss
        reduction and AdamW stay FP32, and validation decodes stay FP32.
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
    schedule: str = "cosine"
    weight_decay: float = 0.035
    warmup_steps: int = 1000
    grad_clip: float = 1.0
    recent_targets: int | None = None
    eval_every: int = 5
    eval_users: int = 4000
    eval_beam: int = 20
    patience: int = 4
    skip_seen: bool = True
    max_minutes: float | None = None
    seed: int = 0
    validity_weight: float = 0.0
    amp: str | None = None

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ZeroGRError(f"schedule: {self.schedule!r} is not one of {', '.join(SCHEDULES)}")


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
        """``"tiger"`` (the GPU recipe, TIGER's architecture: AdamW at 10⁻³, batch 512, the
        cosine fitted to a 12.5-minute budget, best validation NDCG@10 kept; the shipped model
        is it with ``train --cuda-graph`` on an H200), ``"tiger-paper"`` (the same
        model on the TIGER paper's schedule: batch 256, about 200,000 steps, i.e. 390 epochs
        of Beauty's 131,413 training transitions, learning rate 0.01 for 10,000 steps, then
        inverse square root; with AdamW), ``"cpu"`` (≤ 15 minutes on two CPU cores: a
        2 + 2-layer d_model 64 T5 over the newest 8 history items, every transition, a
        12-minute budget) or ``"tiny"`` (tests)."""
        if name == "tiger-paper":
            return cls("tiger-paper", T5Config(), SeqTrainConfig(epochs=390, batch_size=256, lr=1e-2,
                                                                 schedule="inverse-sqrt", warmup_steps=10_000,
                                                                 eval_every=10, eval_users=4000, eval_beam=20,
                                                                 patience=4))
        if name == "tiger":
            # Patience 100 exceeds the 40 evaluations of 200 epochs, so the budget ends the run: validation
            # NDCG still improves when the 12.5-minute cosine anneals. A 2e-3 peak makes the training loss
            # climb mid-schedule (bench/results/beauty-tiger-graph-lr2e-3/).
            return cls("tiger", T5Config(), SeqTrainConfig(epochs=200, batch_size=512, lr=1e-3, warmup_steps=500,
                                                           eval_every=5, eval_users=4000, eval_beam=20, patience=100,
                                                           max_minutes=12.5))
        if name == "cpu":
            return cls("cpu", T5Config(encoder_layers=2, decoder_layers=2, d_model=64, n_heads=4, d_kv=16, d_ff=256,
                                       dropout=0.1, max_items=8),
                       SeqTrainConfig(epochs=30, batch_size=256, lr=5e-3, warmup_steps=100, eval_every=1,
                                      eval_users=500, eval_beam=20, patience=3, max_minutes=12.0))
        if name == "tiny":
            return cls("tiny", T5Config(encoder_layers=1, decoder_layers=1, d_model=16, n_heads=2, d_kv=8, d_ff=32,
                                        dropout=0.0, max_items=3),
                       SeqTrainConfig(epochs=2, batch_size=16, lr=3e-3, warmup_steps=5, eval_every=1, eval_users=8,
                                      eval_beam=8, patience=2),
                       SIDConfig.preset("tiny"))
        raise ZeroGRError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")

    @classmethod
    def from_dict(cls, d: dict) -> "SeqPreset":
        # Checkpoints written before ``skip_seen`` existed were selected with history items kept.
        train = {"skip_seen": False, **d["train"]}
        return cls(d["name"], T5Config(**d["model"]), SeqTrainConfig(**train), SIDConfig(**d["sid"]))


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
                      beam: int, batch_size: int = 256, skip_seen: bool = True) -> dict:
    """Recall@10 and NDCG@10 (filtering first) of ``users``' validation items."""
    from .quality import decode_rows, ranking_metrics

    histories = [row_of_item[split.history(int(u), "valid")] for u in users]
    lists = decode_rows(study, histories, "filter-first", beam, batch_size, skip_seen=skip_seen)
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


@dataclass(frozen=True)
class RunControl:
    """How one call of a training run that may span several calls behaves.

    Attributes
    ----------
    state : Path or None
        Training state written (atomically) after every epoch and when the call stops;
        None: no state, one uninterrupted run.
    resume : bool
        Continue from ``state`` instead of starting afresh.
    stop_after_s : float or None
        Wall-clock seconds this call may use, from ``call_start``. Checked between epochs:
        the call stops before an epoch that its predicted length (the last epoch's, plus
        the last validation decode's when it decodes) would carry past the limit, always
        after at least one epoch. Stopping here saves the state and does not end the
        schedule.
    call_start : float or None
        ``time.perf_counter()`` when the call began (default: when training began).
    identity : dict
        What the state must match to be resumed (preset, data and SID fingerprints);
        compared field by field.
    """

    state: Path | None = None
    resume: bool = False
    stop_after_s: float | None = None
    call_start: float | None = None
    identity: dict = field(default_factory=dict)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def read_state(path: Path, identity: dict) -> dict:
    """The training state in ``path``, checked to belong to the run described by ``identity``.

    Raises
    ------
    ZeroGRError
        Missing, unreadable or foreign file, or a state of another preset, data, seed,
        budget or validity weight (the first differing field is named).
    """
    blob = read_checkpoint(path, STATE_FORMAT, what="training state")
    mine, theirs = _flat(identity), _flat(blob.get("identity", {}))
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            raise ZeroGRError(f"{path}: training state of another run ({key} is {theirs.get(key)!r} there, "
                              f"{mine.get(key)!r} here); drop --resume to start afresh")
    return blob


def _save_atomic(obj: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _numpy_rng_state() -> dict:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return dict(name=name, keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos), has_gauss=int(has_gauss),
                cached=float(cached))


def _set_numpy_rng_state(s: dict) -> None:
    np.random.set_state((s["name"], s["keys"].numpy().astype(np.uint32), s["pos"], s["has_gauss"], s["cached"]))


def _cpu(state: dict) -> dict:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def check_amp(amp: str | None, device: torch.device) -> None:
    """Refuse an autocast setting the device cannot honour (bfloat16 autocast is CUDA only:
    on the CPU it would be slower and change results)."""
    if amp not in (None, "bf16"):
        raise ZeroGRError(f"--amp: {amp!r} is not supported (choose bf16)")
    if amp is not None and device.type != "cuda":
        raise ZeroGRError(f"--amp {amp} needs a CUDA device (training runs on {device}); drop --amp on the CPU")


def learning_rate(tc: SeqTrainConfig, step: int, total_steps: int, elapsed_s: float, budget_s: float) -> float:
    """Learning rate of ``step`` (0-based) under ``tc.schedule``.

    Parameters
    ----------
    tc : SeqTrainConfig
    step : int
        Optimizer steps taken before this one, over every call.
    total_steps : int
        Steps of the whole schedule (``epochs`` × batches per epoch).
    elapsed_s, budget_s : float
        Training seconds so far and the ``max_minutes`` budget in seconds (``math.inf``
        without one); only the cosine follows them.
    """
    if tc.schedule == "inverse-sqrt":
        return tc.lr * math.sqrt(tc.warmup_steps / max(step + 1, tc.warmup_steps))
    # Cosine over whichever ends first, the epochs or the wall-clock budget, so a
    # budgeted run still anneals; warm-up is linear.
    progress = min(1.0, max(step / total_steps, elapsed_s / budget_s))
    return tc.lr * min(1.0, (step + 1) / tc.warmup_steps) * 0.5 * (1 + math.cos(math.pi * progress))


def check_cuda_graph(cuda_graph: bool, device: torch.device) -> None:
    """Refuse ``--cuda-graph`` off CUDA, before any work."""
    if cuda_graph and device.type != "cuda":
        raise ZeroGRError(f"--cuda-graph: CUDA graphs need --device cuda, got {device}")


def train_t5(preset: SeqPreset, split: LeaveOneOut, catalog: Catalog, row_of_item: np.ndarray,
             device: torch.device, log=print, control: RunControl | None = None, compile: bool = False,
             cuda_graph: bool = False) -> tuple[T5Recommender, list[dict], dict]:
    """Train a model (fresh, or resumed from ``control.state``).

    The learning rate is a function of the global step and of the training seconds
    accumulated over every call, so a run split into calls follows the schedule of one
    uninterrupted run (exactly when the schedule is step-based, i.e. without
    ``max_minutes``).

    With ``compile``, each batch's forward pass and loss run through ``torch.compile`` at
    one static shape (every batch padded to the full history width; the padding is masked,
    so the objective is the same up to rounding, and dropout draws from the compiled
    graph's generator). A state may be resumed with or without it.

    With ``cuda_graph`` (CUDA only), every full batch's step (forward, backward, clipping,
    AdamW) is captured once in a CUDA graph at the full history width and replayed
    (:class:`~zerogr_core.recsys.graphed_step.GraphedTrainStep`); an epoch's last, partial
    batch runs eagerly. The objective is the same; dropout draws differ from an eager run.
    A state may be resumed with or without it.

    Returns
    -------
    model : T5Recommender
        Best validation weights, eval mode (the current weights when the call stopped
        before the end of the schedule).
    history : list of dict
        One record per epoch, over all calls.
    best : dict
        The selection record (best epoch, its scores) and ``stopped``: why training
        ended (``"epochs"``, ``"patience"``, ``"max_minutes"``) or ``"stop_after"`` when
        this call stopped for time before the end of the schedule.
    """
    tc = preset.train
    control = control or RunControl()
    start = time.perf_counter()
    call_start = control.call_start if control.call_start is not None else start
    torch.manual_seed(tc.seed)
    np.random.seed(tc.seed)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    check_amp(tc.amp, device)
    check_cuda_graph(cuda_graph, device)
    generator = torch.Generator().manual_seed(tc.seed)
    model = T5Recommender(preset.model, catalog.codebook_sizes).to(device)
    sids = torch.from_numpy(catalog.sids.astype(np.int64)).to(device)
    study = StudyModel(model, catalog, sids, {})
    rows_np, lengths_np, targets_np = transitions(split, row_of_item, preset.model.max_items, tc.recent_targets)
    rows, lengths, targets = (torch.from_numpy(a).to(device) for a in (rows_np, lengths_np, targets_np))
    tables = ValidityTables(catalog, device) if tc.validity_weight > 0 else None
    n = targets.numel()
    log(f"{n} training transitions, model {model.describe()['parameters']:,} parameters on {device}"
        + (f", autocast {tc.amp}" if tc.amp else "") + (", compiled step" if compile else "")
        + (", step in a CUDA graph" if cuda_graph else ""))
    decay = [p for name, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for name, p in model.named_parameters() if p.dim() < 2]
    # The fused CUDA kernel updates every parameter in one launch; results match the
    # default implementation up to rounding.
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=tc.lr, fused=True if cuda else None)
    total = math.ceil(n / tc.batch_size) * tc.epochs
    budget = tc.max_minutes * 60 if tc.max_minutes is not None else math.inf
    # A captured step must not cache autocast's casts across replays.
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not cuda_graph) if tc.amp == "bf16"
                else contextlib.nullcontext())
    eval_batch = 1024 if cuda else 256       # decodes are independent per request: a larger batch only fills the GPU

    step, first_epoch, prior_s, decode_s = 0, 1, 0.0, 0.0
    best = dict(epoch=0, ndcg=-1.0, recall=-1.0)
    best_state, since_best, stopped, history = None, 0, None, []
    if control.resume:
        blob = read_state(control.state, control.identity)
        model.load_state_dict(blob["model"])
        optim.load_state_dict(blob["optimizer"])
        for group in optim.param_groups:        # the state may come from another device or mode
            group["fused"] = True if cuda else None
            group["capturable"] = False
            group["lr"] = float(group["lr"])
            for p in group["params"]:
                if "step" in optim.state.get(p, {}):    # fused AdamW keeps its step counters on the device
                    optim.state[p]["step"] = optim.state[p]["step"].to(p.device if cuda else "cpu", torch.float32)
        generator.set_state(blob["generator"])
        torch.set_rng_state(blob["torch_rng"])
        if cuda and blob.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(blob["cuda_rng"], device)
        _set_numpy_rng_state(blob["numpy_rng"])
        step, first_epoch, prior_s = blob["step"], blob["epoch"] + 1, blob["elapsed_s"]
        decode_s, history, best, since_best = blob["decode_s"], blob["history"], blob["best"], blob["since_best"]
        best_state = blob["best_state"]
        stopped = blob["stopped"]
        log(f"resumed {control.state}: epoch {blob['epoch']} of {tc.epochs}, step {step}, "
            f"{prior_s / 60:.1f} min trained" + (f" (already finished: {stopped})" if stopped else ""))

    def elapsed() -> float:
        """Training seconds over every call."""
        return prior_s + time.perf_counter() - start

    def lr_at(step: int) -> float:
        return learning_rate(tc, step, total, elapsed(), budget)

    def save_state(epoch: int) -> None:
        if control.state is None:
            return
        _save_atomic(dict(format=STATE_FORMAT, identity=control.identity, epoch=epoch, step=step,
                          model=_cpu(model.state_dict()), optimizer=optim.state_dict(),
                          generator=generator.get_state(), torch_rng=torch.get_rng_state(),
                          cuda_rng=torch.cuda.get_rng_state(device) if cuda else None,
                          numpy_rng=_numpy_rng_state(), history=history, best=best, best_state=best_state,
                          since_best=since_best, elapsed_s=elapsed(), decode_s=decode_s, stopped=stopped),
                     control.state)

    def batch_loss(batch_rows, batch_lengths, target_rows, drawn_rows):
        """Training objective of one batch: cross-entropy, plus the validity term when on."""
        ids, mask = model.pack(batch_rows, batch_lengths, sids)
        if drawn_rows is None:
            return model.loss(ids, mask, sids[target_rows])
        loss, (true_bands, drawn_bands) = model.level_logits(ids, mask, sids[target_rows], sids[drawn_rows])
        return loss + tc.validity_weight * 0.5 * (tables.invalid_loss(true_bands, target_rows)
                                                  + tables.invalid_loss(drawn_bands, drawn_rows))

    # The eager step of this small model is bound by per-operator overhead (Python, dispatch,
    # launches) rather than arithmetic; compiling fuses the forward and backward passes.
    forward = torch.compile(batch_loss) if compile else batch_loss
    compile_errors: tuple = ()          # they surface at the first call of the compiled step
    if compile:
        from torch._dynamo.exc import TorchDynamoException
        compile_errors = (TorchDynamoException,)
    full_width = rows.shape[1]

    def step_body(idx, drawn, width=full_width):
        """Forward, backward, clipping and AdamW on the transitions ``idx``; the detached loss."""
        with autocast:
            try:
                loss = forward(rows[idx, :width], lengths[idx], targets[idx], drawn)
            except compile_errors as err:
                first = first_line(err, type(err).__name__, 200)
                raise ZeroGRError(f"--compile: torch.compile could not build the training step "
                                  f"({type(err).__name__}: {first}); train without --compile") from None
        loss = loss.float()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optim.step()
        return loss.detach()

    graphed = None
    if cuda_graph:
        from .graphed_step import GraphedTrainStep
        graphed = GraphedTrainStep(step_body, optim, tc.batch_size, tables is not None, device)
    eval_users = fixed_users(split.n_users, tc.eval_users)
    epoch = first_epoch - 1
    last_epoch_s = None
    for epoch in range(first_epoch, tc.epochs + 1):
        if stopped is not None:
            break
        is_eval = epoch % tc.eval_every == 0 or epoch == tc.epochs
        if control.stop_after_s is not None and last_epoch_s is not None:
            predicted = last_epoch_s + (decode_s if is_eval else 0.0)
            if time.perf_counter() - call_start + predicted > control.stop_after_s:
                epoch -= 1
                break
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(n, generator=generator)
        order_dev = order.to(device)      # one copy per epoch, not one per step
        running, seen, out_of_time = torch.zeros((), device=device), 0, False
        for lo in range(0, n, tc.batch_size):
            idx = order_dev[lo:lo + tc.batch_size]
            drawn = None
            if tables is not None:
                drawn = torch.randint(catalog.n_items, (idx.numel(),), generator=generator).to(device)
            lr = lr_at(step)
            if graphed is not None:
                loss = graphed(idx, drawn, lr) if idx.numel() == tc.batch_size else graphed.eager(idx, drawn, lr)
            else:
                # A compiled step keeps one shape (the full history width); eager trims the batch
                # to its longest history, computed on the host so that it costs no device sync.
                width = full_width if compile else int(lengths_np[order[lo:lo + tc.batch_size].numpy()].max())
                for group in optim.param_groups:
                    group["lr"] = lr
                optim.zero_grad(set_to_none=True)
                loss = step_body(idx, drawn, width)
            step += 1
            running += loss * idx.numel()
            seen += idx.numel()
            if elapsed() > budget:
                out_of_time = True
                break
        record = dict(epoch=epoch, train_loss=float(running) / max(seen, 1), seconds=time.perf_counter() - t0,
                      transitions=seen, lr=lr)
        record["valid_loss"] = [validation_loss(model, sids, split, row_of_item, eval_users)]
        if is_eval or out_of_time:
            t_dec = time.perf_counter()
            scores = validation_scores(study, split, row_of_item, eval_users, tc.eval_beam, eval_batch,
                                       skip_seen=tc.skip_seen)
            decode_s = time.perf_counter() - t_dec
            record.update(valid_recall=scores["recall"], valid_ndcg=scores["ndcg"], valid_k=scores["k"])
            if (scores["ndcg"], scores["recall"]) > (best["ndcg"], best["recall"]):
                best = dict(epoch=epoch, ndcg=scores["ndcg"], recall=scores["recall"], k=scores["k"])
                best_state = _cpu(model.state_dict())
                since_best = 0
            else:
                since_best += 1
        record["elapsed_s"] = elapsed()
        history.append(record)
        log(f"epoch {epoch}: train loss {record['train_loss']:.4f}, valid loss {record['valid_loss'][0]:.4f}"
            + (f", valid Recall@{record['valid_k']} {record['valid_recall']:.4f} NDCG@{record['valid_k']} "
               f"{record['valid_ndcg']:.4f}" if "valid_ndcg" in record else "")
            + f" ({record['seconds']:.0f} s, {record['elapsed_s'] / 60:.1f} min in all)")
        if out_of_time or elapsed() > budget:
            stopped = "max_minutes"
        elif since_best >= tc.patience:
            stopped = "patience"
        elif epoch == tc.epochs:
            stopped = "epochs"
        save_state(epoch)
        last_epoch_s = time.perf_counter() - t0 - (decode_s if is_eval or out_of_time else 0.0)
    if stopped is None:
        if epoch >= tc.epochs:       # a resumed state whose epochs were all done
            stopped = "epochs"
        else:                        # the state of this epoch is already written
            model.eval()
            best = dict(best, stopped="stop_after", epochs_done=epoch)
            log(f"stopped for time after epoch {epoch} of {tc.epochs} ({elapsed() / 60:.1f} min trained in all); "
                f"state in {control.state}")
            return model, history, best
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    best = dict(best, stopped=stopped)
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
                    max_minutes: float | None = None, seed: int | None = None, lr: float | None = None,
                    patience: int | None = None, validity_weight: float | None = None, amp: str | None = None,
                    state: str | Path | None = None,
                    resume: bool = False, stop_after_minutes: float | None = None, call_start: float | None = None,
                    compile: bool = False, cuda_graph: bool = False, split_record: dict | None = None,
                    log=print) -> dict:
    """Train on ``data`` and write the checkpoint ``out`` (or, when this call stops for
    time before the end of the schedule, only the training state).

    Parameters
    ----------
    data : SequenceData
    out : str or Path
    preset : {"tiger", "tiger-paper", "cpu", "tiny"}
    device : str or torch.device, optional
        Default: CUDA when available, else CPU.
    max_minutes, seed, lr, patience, validity_weight, amp : optional
        Override the preset's wall-clock budget (of the whole run, over every call), seed,
        peak learning rate, early-stopping patience, validity-term weight and autocast
        (``"bf16"``, CUDA only). Overrides are part of the recorded recipe.
    state : str or Path, optional
        Training state file (default ``<out>.state.pt`` when ``resume`` or
        ``stop_after_minutes`` is given; without any of the three no state is written).
    resume : bool
        Continue the run saved in ``state``.
    stop_after_minutes : float, optional
        Wall-clock minutes of this call (from ``call_start``) after which training stops
        between epochs with the state saved, without ending the schedule.
    call_start : float, optional
        ``time.perf_counter()`` when the call began (default: now).
    compile : bool
        Run each training batch through ``torch.compile`` (see :func:`train_t5`); recorded
        in the checkpoint, not part of the recipe (a state resumes either way).
    cuda_graph : bool
        Replay each full batch's step from one CUDA graph (see :func:`train_t5`); recorded
        like ``compile``.
    split_record : dict, optional
        How ``data`` was derived from a larger data set (e.g. the cold-start items held
        out, :meth:`~.cold_items.ColdSplit.record`); stored as the checkpoint's ``split``
        and part of a resumable run's identity.

    Returns
    -------
    dict
        The checkpoint's metadata (everything but the state dict and SID table), with
        ``finished`` True; or, when the call stopped for time, ``finished`` False,
        ``state``, ``epoch`` (done so far), ``epochs`` and ``train_seconds``.
    """
    from dataclasses import replace

    call_start = time.perf_counter() if call_start is None else call_start
    config = SeqPreset.preset(preset)
    overrides = {k: v for k, v in (("max_minutes", max_minutes), ("seed", seed), ("lr", lr), ("patience", patience),
                                   ("validity_weight", validity_weight), ("amp", amp)) if v is not None}
    if overrides:
        config = replace(config, train=replace(config.train, **overrides))
    if not config.train.lr > 0:
        raise ZeroGRError(f"--lr must be > 0, got {config.train.lr}")
    if config.train.patience < 1:
        raise ZeroGRError(f"--patience must be ≥ 1, got {config.train.patience}")
    if config.train.max_minutes is not None and config.train.max_minutes <= 0:
        raise ZeroGRError(f"--max-minutes must be > 0, got {config.train.max_minutes}")
    if not config.train.validity_weight >= 0:
        raise ZeroGRError(f"--validity-weight must be ≥ 0, got {config.train.validity_weight}")
    if stop_after_minutes is not None and not stop_after_minutes > 0:
        raise ZeroGRError(f"--stop-after-minutes must be > 0, got {stop_after_minutes}")
    dev = resolve_device(device)
    check_amp(config.train.amp, dev)
    check_cuda_graph(cuda_graph, dev)
    out = Path(out)
    if state is None and (resume or stop_after_minutes is not None):
        state = out.with_name(out.name + ".state.pt")
    state = Path(state) if state is not None else None
    if resume and not state.is_file():
        raise ZeroGRError(f"{state}: training state not found (--resume needs the state of an earlier call)")
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
    item_ids = np.asarray(sid.catalog.item_ids, dtype=np.int64)
    sid_sha = hashlib.sha256(sid.catalog.sids.astype(np.int64).tobytes() + item_ids.tobytes()).hexdigest()
    control = RunControl(state=state, resume=resume,
                         stop_after_s=stop_after_minutes * 60 if stop_after_minutes is not None else None,
                         call_start=call_start,
                         identity=dict(study=asdict(config), data=data.fingerprint(), sids=sid_sha,
                                       **({"split": split_record} if split_record is not None else {})))
    train_start = time.perf_counter()
    model, history, best = train_t5(config, split, sid.catalog, sid.row_of_item, dev, log=log, control=control,
                                    compile=compile, cuda_graph=cuda_graph)
    if best["stopped"] == "stop_after":
        return dict(finished=False, state=str(state), epoch=best["epochs_done"], epochs=config.train.epochs,
                    train_seconds=history[-1]["elapsed_s"], call_seconds=time.perf_counter() - call_start)
    import transformers

    # Over every call when the run was resumable; otherwise this call's loop, as measured here.
    train_seconds = history[-1]["elapsed_s"] if state is not None and history else time.perf_counter() - train_start
    meta = dict(format=CHECKPOINT_FORMAT, study=asdict(config), codebook_sizes=list(sid.catalog.codebook_sizes),
                data=data.summary(), sid_report=sid_report, sid_source="file" if data.sid_file else "rq-kmeans",
                history=history, selection=best, train_seconds=train_seconds,
                device=str(dev), torch=str(torch.__version__), transformers=transformers.__version__,
                optimizer=dict(name="AdamW", fused=dev.type == "cuda"), amp=config.train.amp, compiled=compile,
                cuda_graph=cuda_graph, split=split_record,
                total_seconds=time.perf_counter() - start)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(meta, state_dict={k: v.detach().cpu() for k, v in model.state_dict().items()},
                    sids=torch.from_numpy(sid.catalog.sids.astype(np.int64)),
                    item_ids=torch.from_numpy(item_ids)), out)
    log(f"wrote {out} ({meta['train_seconds'] / 60:.1f} min of training)")
    return dict(meta, finished=True)


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
