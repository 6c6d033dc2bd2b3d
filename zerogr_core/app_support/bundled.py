"""What the bundled recommenders of the app (:mod:`.movielens`, :mod:`.beauty`) share: an
overridable checkpoint path, an availability check, and loading with one-line errors."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..errors import ZeroGRError


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
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ZeroGRError(f"{path}: the checkpoint does not fit this version of the recommender ({first}); "
                          f"retrain it with `{retrain}`") from None
