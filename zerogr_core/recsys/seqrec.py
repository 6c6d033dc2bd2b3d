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

The presets are :mod:`.seqrec_config`'s, the loop is :mod:`.seqrec_train`'s. A run may span
several calls (a lent GPU allows ten minutes per command): with a
:class:`~.seqrec_train.RunControl` the loop writes a training state after every epoch (model,
AdamW, the shuffle, torch, CUDA and NumPy RNG states, history, best record and weights,
training seconds so far), stops between epochs when the call's time is up, and a later call
resumes it. The learning rate depends only on the global step and on the training seconds
summed over calls, so the split run follows the uninterrupted run's schedule.

The checkpoint (one ``torch.save`` dict, loadable with ``weights_only=True``) holds the
preset, the state dict, the SID table and item id of every catalog row, and the data
fingerprint; :func:`load_sequence_checkpoint` restores a :class:`~.train.StudyModel`.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from ..catalog import Catalog
from ..errors import ZeroGRError
from .data import leave_one_out
from .seqrec_config import SeqPreset
from .seqrec_train import RunControl, check_amp, check_cuda_graph, train_t5
from .sequences import BEAUTY_DIR, SequenceData, load_dataset, load_sequences, sequence_semantic_ids
from .t5 import T5Recommender
from .train import StudyModel, read_checkpoint, resolve_device, rows_of_ids

CHECKPOINT_FORMAT = "zerogr-seqrec-1"
#: Where a checkpoint for the bundled Beauty data goes by default (shipped when trained).
BEAUTY_CHECKPOINT = BEAUTY_DIR / "model.pt"


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


def rows_for(study: StudyModel, data: SequenceData, path, data_flag: str | None = None,
             checkpoint_flag: str | None = None) -> np.ndarray:
    """Catalog row of every item index of ``data``, after checking it is the training data.

    Parameters
    ----------
    study : StudyModel
    data : SequenceData
    path : str or Path
        The checkpoint of ``study``, as the error names it.
    data_flag, checkpoint_flag : str, optional
        The command's arguments that named the data (``"--data"``, ``"--dataset"``) and the
        checkpoint (``"--checkpoint"``), named in the error before the folder and the file.

    Returns
    -------
    np.ndarray (n_items,) int64

    Raises
    ------
    ZeroGRError
        ``--data seq.txt: fingerprint … differs from --checkpoint x.pt's … (…); the model was
        trained on other data``.
    """
    if data.fingerprint() != study.meta["data"]["fingerprint"]:
        ours = f"{data_flag} {data.directory}" if data_flag else str(data.directory)
        theirs = f"{checkpoint_flag} {path}" if checkpoint_flag else f"checkpoint {path}"
        raise ZeroGRError(f"{ours}: fingerprint {data.fingerprint()} differs from {theirs}'s "
                          f"{study.meta['data']['fingerprint']} ({study.meta['data']['directory']}); the model "
                          f"was trained on other data")
    return rows_of_ids(study.catalog, data.item_ids)
