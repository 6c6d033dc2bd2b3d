"""The training loop of :mod:`.seqrec`: the teacher-forced transitions, validation by
constrained beam search, the learning-rate schedule, and the training state that lets one run
span several calls (:class:`RunControl`).

:func:`~zerogr_core.recsys.seqrec.train_sequences` is the entry point; :func:`train_t5`
trains one preset on one split.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..catalog import Catalog
from ..errors import ZeroGRError, first_line
from .data import LeaveOneOut
from .seqrec_config import SeqPreset, SeqTrainConfig
from .t5 import T5Recommender
from .train import StudyModel, ValidityTables, fixed_users, read_checkpoint

STATE_FORMAT = "zerogr-seqrec-state-1"


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
