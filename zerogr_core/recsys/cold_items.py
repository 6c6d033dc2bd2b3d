"""Cold-start items: the seeded split of a sequence data set into warm training data and
cold test sequences (the STATIC paper's §6 setting).

A share of the catalog's items is drawn uniformly (seeded) as *cold*. The model and every
baseline then learn from the *warm* data only: each user's sequence with every cold item
removed (users left with fewer than three warm items drop out of training). A cold item
therefore appears in no training input, no training target and no validation history; it
stays in the catalog with its content semantic ID, so constrained decoding can reach it.

The cold test sequences are the leave-one-out test sequences whose target (the user's last
item) is cold. Their histories keep only the warm items before the target: the paper says
the cold items are unseen in training, and a cold item in a test history would be an input
the model never saw, mixing a second effect into the measurement. A test sequence whose
history holds no warm item is dropped and counted.

Only numpy is needed here; :class:`~.sequences.SequenceData` is rebuilt for the warm part,
so training goes through :func:`~.seqrec.train_sequences` unchanged.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ZeroGRError
from .data import MIN_INTERACTIONS
from .sequences import SequenceData

#: The paper's two cold shares (2 % and 5 % of the catalog).
PAPER_SHARES = (0.02, 0.05)


def check_share(share: float, what: str = "--cold") -> float:
    """``share`` as a float in (0, 1), or a one-line error naming ``what``."""
    try:
        share = float(share)
    except (TypeError, ValueError):
        raise ZeroGRError(f"{what}: {share!r} is not a number") from None
    if not 0.0 < share < 1.0:
        raise ZeroGRError(f"{what} must be a share of the catalog in (0, 1), got {share:g}")
    return share


def draw_cold_items(item_ids: np.ndarray, share: float, seed: int) -> np.ndarray:
    """Draw ``round(share * N)`` of ``item_ids`` uniformly without replacement (at least one).

    Parameters
    ----------
    item_ids : np.ndarray, shape (N,), int64
        The catalog's item ids.
    share : float
        In (0, 1).
    seed : int

    Returns
    -------
    np.ndarray, shape (C,), int64
        Cold item ids, ascending.
    """
    share = check_share(share)
    item_ids = np.asarray(item_ids, dtype=np.int64)
    count = max(1, int(round(share * item_ids.size)))
    if count >= item_ids.size:
        raise ZeroGRError(f"--cold {share:g} of {item_ids.size} items leaves no warm item")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(item_ids, size=count, replace=False))


def cold_item_set(catalog, share: float = 0.02, seed: int = 0) -> np.ndarray:
    """A seeded cold-start item set of ``catalog`` (e.g. for a decode restricted to it).

    Parameters
    ----------
    catalog : Catalog
        Any project catalog; only ``item_ids`` is read.
    share : float
        Share of the catalog's items, in (0, 1).
    seed : int

    Returns
    -------
    np.ndarray, shape (C,)
        Item ids of the catalog (its own dtype), ascending; the same set the ``coldstart``
        study draws for the same items, share and seed.
    """
    ids = np.asarray(catalog.item_ids)
    if ids.dtype.kind not in "iu":
        # String ids: draw positions, then map back, so the set is still seeded and uniform.
        picked = draw_cold_items(np.arange(ids.size, dtype=np.int64), share, seed)
        return np.sort(ids[picked])
    return draw_cold_items(ids.astype(np.int64), share, seed).astype(ids.dtype)


@dataclass(frozen=True, eq=False)
class ColdSplit:
    """The warm training data and the cold test sequences of one draw.

    Attributes
    ----------
    share : float
    seed : int
    cold_items : np.ndarray, shape (C,), int64
        Cold item *indices* of the data (rows of ``data.item_ids``), ascending.
    warm : SequenceData
        Every user's sequence without its cold items; users with fewer than three warm
        items dropped (counted in ``warm.dropped_users``). Same catalog as the full data.
    test_users : np.ndarray, shape (T,), int64
        User rows (of the full data) of the cold test sequences.
    test_histories : list of np.ndarray (h_t,) int64
        Their warm item indices before the target, oldest first; each non-empty.
    test_targets : np.ndarray, shape (T,), int64
        The cold target item index of each.
    removed_interactions : int
        Interactions with a cold item, removed from the warm data.
    empty_history_tests : int
        Cold test sequences dropped because no warm item preceded the target.
    """

    share: float
    seed: int
    cold_items: np.ndarray
    warm: SequenceData
    test_users: np.ndarray
    test_histories: list
    test_targets: np.ndarray
    removed_interactions: int
    empty_history_tests: int

    def cold_item_ids(self) -> np.ndarray:
        """Cold item ids, ascending; shape (C,), int64."""
        return self.warm.item_ids[self.cold_items]

    def digest(self) -> str:
        """SHA-256 (hex, 16 chars) of the cold item ids: names the draw in reports."""
        return hashlib.sha256(np.ascontiguousarray(self.cold_item_ids(), dtype=np.int64).tobytes()).hexdigest()[:16]

    def record(self) -> dict:
        """What a checkpoint's recipe and a report say about the split (JSON-ready)."""
        return dict(kind="cold-start-items", share=self.share, seed=self.seed, n_items=int(self.warm.n_items),
                    n_cold=int(self.cold_items.size), cold_sha256=self.digest(),
                    cold_item_ids=self.cold_item_ids().tolist(), removed_interactions=self.removed_interactions,
                    warm_users=int(self.warm.n_users), n_cold_test=int(self.test_targets.size),
                    empty_history_tests=self.empty_history_tests,
                    test_history="warm items before the target (cold items removed)")


def cold_split(data: SequenceData, share: float, seed: int = 0) -> ColdSplit:
    """Draw the cold items of ``data`` and split it into warm data and cold test sequences.

    Parameters
    ----------
    data : SequenceData
        Loaded with its SID file, so the catalog holds every item with a SID.
    share : float
        Share of the catalog's items drawn as cold, in (0, 1).
    seed : int

    Returns
    -------
    ColdSplit

    Raises
    ------
    ZeroGRError
        A share outside (0, 1); no user keeping a training example (four warm interactions:
        the last two are held out); no cold test sequence.
    """
    share = check_share(share)
    cold_ids = draw_cold_items(data.item_ids, share, seed)
    cold = np.searchsorted(data.item_ids, cold_ids).astype(np.int64)
    is_cold = np.zeros(data.n_items, dtype=bool)
    is_cold[cold] = True
    warm_mask = ~is_cold[data.items]
    user_of = np.repeat(np.arange(data.n_users), np.diff(data.offsets))
    warm_len = np.bincount(user_of[warm_mask], minlength=data.n_users)
    keep_user = warm_len >= MIN_INTERACTIONS
    kept = warm_mask & keep_user[user_of]
    # leave-one-out holds out each user's last two items, and a training pair needs two more: without
    # such a user the training failed later as "training data: no user has two or more training interactions"
    if not (warm_len > MIN_INTERACTIONS).any():
        raise ZeroGRError(f"--cold {share:g}: no user keeps {MIN_INTERACTIONS + 1} or more warm interactions (each "
                          f"user's last two are held out for validation and test, and a training example needs two "
                          f"more); lower --cold")
    lengths = warm_len[keep_user]
    warm = replace(data, user_ids=data.user_ids[keep_user], items=data.items[kept],
                   offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                   dropped_users=data.dropped_users + int((~keep_user).sum()))
    ends = data.offsets[1:] - 1
    targets = data.items[ends]
    test_users, histories, empty = [], [], 0
    for user in np.flatnonzero(is_cold[targets]):
        before = data.items[data.offsets[user]:ends[user]]
        hist = before[~is_cold[before]]
        if hist.size == 0:
            empty += 1
            continue
        test_users.append(user)
        histories.append(hist.astype(np.int64))
    if not test_users:
        raise ZeroGRError(f"--cold {share:g} (seed {seed}): no test sequence has a cold target with a warm history; "
                          f"raise --cold or use more users")
    test_users = np.asarray(test_users, dtype=np.int64)
    return ColdSplit(share=share, seed=int(seed), cold_items=cold, warm=warm, test_users=test_users,
                     test_histories=histories, test_targets=targets[test_users].astype(np.int64),
                     removed_interactions=int((~warm_mask).sum()), empty_history_tests=empty)
