"""What the bundled recommenders of the app (:mod:`.movielens`, :mod:`.beauty`) share: an
overridable checkpoint path, an availability check, and loading with one-line errors; and
what every client of a project checkpoint shares (the app, the commands' ``--checkpoint``):
loading a checkpoint of either trainer, and its KV-cache step model prefilled with histories."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ZeroGRError, first_line


#: The commands that write each trainer's checkpoints, named when one holds weights of another version.
RETRAIN_MOVIELENS = "python -m zerogr_core train-movielens --out FILE"
RETRAIN_SEQUENCE = "python -m zerogr_core train --out FILE"


def checkpoint_path(env: str, default: Path) -> Path:
    """``default``, or the file named by the environment variable ``env`` when it is set."""
    override = os.environ.get(env)
    return Path(override) if override else default


def is_file(path: Path) -> bool:
    """Whether ``path`` is a file; an unreadable path (permissions, a name too long) counts as missing."""
    try:
        return path.is_file()
    except OSError:
        return False


def load_study(path: Path, loader: Callable, missing: str, retrain: str, device="cpu"):
    """``loader(path, device=device)``, with every failure as one :class:`ZeroGRError` line.

    Parameters
    ----------
    missing : str
        The message when the file is absent.
    retrain : str
        The command that rebuilds the checkpoint, for weights of another model version.
    """
    if not is_file(path):
        raise ZeroGRError(missing)
    try:
        return loader(path, device=device)
    except ZeroGRError:
        raise
    # weights of another model version, or a file of the right format holding something else
    except (RuntimeError, KeyError, TypeError, ValueError, AttributeError) as err:
        first = first_line(err, type(err).__name__)
        raise ZeroGRError(f"{path}: the checkpoint does not fit this version of the recommender ({first}); "
                          f"retrain it with `{retrain}`") from None


@dataclass(frozen=True)
class BundledRecommender:
    """One bundled recommender: where its checkpoint is and how it loads.

    Attributes
    ----------
    env : str
        Environment variable that names another checkpoint instead of the bundled one.
    default : str
        ``"module:attribute"`` of the bundled checkpoint's path (resolved when asked, so
        that importing the app does not import the training code).
    loader : str
        ``"module:function"`` that loads a checkpoint: ``loader(path, device=...)``.
    missing : str
        The message when the checkpoint is absent.
    retrain : str
        The command that rebuilds it.
    """

    env: str
    default: str
    loader: str
    missing: str
    retrain: str

    @staticmethod
    def _resolve(ref: str):
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module, package=__package__), name)

    def checkpoint_path(self) -> Path:
        """The bundled checkpoint, or the file named by the environment variable."""
        return checkpoint_path(self.env, self._resolve(self.default))

    def available(self) -> bool:
        """Whether the checkpoint exists."""
        return is_file(self.checkpoint_path())

    def study(self, device="cpu"):
        """The :class:`~zerogr_core.recsys.train.StudyModel` on ``device``.

        Raises
        ------
        ZeroGRError
            Missing, unreadable or foreign checkpoint.
        """
        return load_study(self.checkpoint_path(), self._resolve(self.loader), self.missing, self.retrain,
                          device=device)


def load_project_checkpoint(path, device="cpu"):
    """A checkpoint of ``train-movielens`` or ``train``, whichever the file is.

    Parameters
    ----------
    path : str or Path
    device : str or torch.device

    Returns
    -------
    StudyModel
        The model with the SID catalog it decodes against (``study.catalog``).

    Raises
    ------
    ZeroGRError
        Missing, unreadable or foreign file, or weights of another model version (one line).
    """
    import torch

    from .seqrec import CHECKPOINT_FORMAT as SEQUENCE_FORMAT
    from .seqrec import load_sequence_checkpoint
    from .train import CHECKPOINT_FORMAT as MOVIELENS_FORMAT
    from .train import load_checkpoint

    path = Path(path)
    if not is_file(path):
        raise ZeroGRError(f"{path}: checkpoint not found")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 — torch raises many types for foreign files
        raise ZeroGRError(f"{path}: not a readable checkpoint ({type(exc).__name__})") from None
    fmt = blob.get("format") if isinstance(blob, dict) else None  # a saved list or tensor reads, too
    loaders = {MOVIELENS_FORMAT: (load_checkpoint, RETRAIN_MOVIELENS),
               SEQUENCE_FORMAT: (load_sequence_checkpoint, RETRAIN_SEQUENCE)}
    if fmt not in loaders:
        raise ZeroGRError(f"{path}: not a checkpoint of train-movielens ({MOVIELENS_FORMAT}) or train "
                          f"({SEQUENCE_FORMAT})")
    loader, retrain = loaders[fmt]
    return load_study(path, loader, f"{path}: checkpoint not found", retrain, device=device)


def checkpoint_option(option: str, path, loader: Callable | None = None, retrain: str | None = None,
                      device="cpu"):
    """A checkpoint named on the command line: every failure is one line naming ``option`` and the file.

    Parameters
    ----------
    option : str
        The argument that named it, e.g. ``"--checkpoint"``.
    path : str or Path
    loader : callable, optional
        ``loader(path, device=...)`` of the one kind of checkpoint the command takes (default:
        either trainer's, :func:`load_project_checkpoint`).
    retrain : str, optional
        With ``loader``: the command that rebuilds the checkpoint, for weights of another version.
    device : str or torch.device

    Returns
    -------
    StudyModel

    Raises
    ------
    ZeroGRError
        ``"--checkpoint FILE: …"``: missing, unreadable or foreign file, or weights of another
        model version.
    """
    path = Path(path)
    try:
        if loader is None:
            return load_project_checkpoint(path, device=device)
        return load_study(path, loader, f"{path}: checkpoint not found", retrain, device=device)
    except ZeroGRError as err:
        text = " ".join(str(err).split())
        # the loaders' errors begin with the file, except those about a file beside it (its SID catalog)
        raise ZeroGRError(f"{option} {text}" if text.startswith(f"{path}:") else f"{option} {path}: {text}") from None


def study_step_model(study, histories, beam_width: int):
    """A project recommender's KV-cache step model, prefilled with ``histories``.

    Parameters
    ----------
    study : StudyModel
    histories : sequence of np.ndarray (h_b,) int64
        Per request, item rows of ``study.catalog``, oldest first, each non-empty.
    beam_width : int

    Returns
    -------
    StepModel
        :class:`~zerogr_core.models.t5.T5StepModel` for the T5 recommender (it offers
        ``step_model()``), :class:`~zerogr_core.models.tiger.TigerStepModel` otherwise;
        every decoder takes it in place of a ``hidden_fn``.
    """
    from ..models.tiger import TigerStepModel

    model = study.model
    if hasattr(model, "step_model"):
        step_model = model.step_model()
        step_model.prefill(*model.encoder_inputs(histories, study.sids), beam_width=beam_width)
    else:
        step_model = TigerStepModel(model)
        step_model.prefill_rows(histories, study.sids, beam_width=beam_width)
    return step_model
