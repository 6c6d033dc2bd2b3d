"""What the bundled recommenders of the app (:mod:`.movielens`, :mod:`.beauty`) share: an
overridable checkpoint path, an availability check, and loading with one-line errors."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ZeroGRError, first_line


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
    except (RuntimeError, KeyError, TypeError) as err:  # weights of another model version
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
