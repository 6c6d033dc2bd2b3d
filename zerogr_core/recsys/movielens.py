"""The bundled MovieLens recommender, its SID catalog and its test users.

The checkpoint is a :class:`.bundled.BundledRecommender` (a missing or foreign checkpoint
gives one clear message); the catalog and the leave-one-out test requests come from
:mod:`zerogr_core.recsys` (``load_movielens``, ``leave_one_out``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..catalog.catalog import Catalog
from . import bundled

MISSING = ("the bundled MovieLens recommender (sample_catalogs/movielens/model.pt) is not there; "
           "train it with `python -m zerogr_core train-movielens`, or pick another catalog")


#: Environment variable naming another checkpoint (a model trained with train-movielens).
CHECKPOINT_ENV = "ZEROGR_MOVIELENS_CHECKPOINT"
MODEL = bundled.BundledRecommender(CHECKPOINT_ENV, ".train:BUNDLED_CHECKPOINT", ".train:load_checkpoint",
                                   MISSING, "python -m zerogr_core train-movielens")
checkpoint_path = MODEL.checkpoint_path
available = MODEL.available
bundled_study = MODEL.study


def bundled_catalog() -> Catalog:
    """The bundled recommender's SID catalog (named ``movielens``)."""
    study = bundled_study("cpu")
    return dataclasses.replace(study.catalog, name="movielens")


@dataclass(frozen=True, eq=False)
class TestUsers:
    """The leave-one-out test requests of the bundled data.

    Attributes
    ----------
    user_ids : np.ndarray, shape (U,), int64
        MovieLens user ids.
    histories : list of np.ndarray
        Per user, catalog rows of the visible history (training items + validation item).
    targets : np.ndarray, shape (U,), int64
        Catalog row of each user's held-out test item.
    titles : np.ndarray, shape (N,), object
        Title of every catalog row.
    """

    user_ids: np.ndarray
    histories: list
    targets: np.ndarray
    titles: np.ndarray

    @property
    def n_users(self) -> int:
        return int(self.user_ids.size)

    def pick(self, rows: np.ndarray) -> tuple[list, np.ndarray]:
        """Histories and targets of the user rows ``rows``."""
        return [self.histories[int(r)] for r in rows], self.targets[np.asarray(rows, dtype=np.int64)]

    def sample(self, count: int, seed: int = 0) -> np.ndarray:
        """``count`` distinct user rows, seeded."""
        rng = np.random.default_rng(seed)
        count = max(1, min(count, self.n_users))
        return np.sort(rng.choice(self.n_users, size=count, replace=False))


def test_users(study) -> TestUsers:
    """Test requests of every user of the data the bundled model was trained on."""
    from .data import leave_one_out, load_movielens

    data = load_movielens(None)
    split = leave_one_out(data)
    row_of_item = study.rows_of_items(data)
    histories = [row_of_item[split.history(u, "test")] for u in range(split.n_users)]
    targets = row_of_item[split.test_items]
    titles = np.empty(study.catalog.n_items, dtype=object)
    titles[row_of_item] = data.titles
    if study.catalog.titles is not None:
        have = np.array([bool(t) for t in study.catalog.titles])
        titles[have] = study.catalog.titles[have]
    return TestUsers(data.user_ids.astype(np.int64), histories, targets.astype(np.int64), titles)


def recorded_metrics(study) -> dict | None:
    """The test metrics the checkpoint recorded at training time (or ``None``)."""
    recorded = study.meta.get("recorded") or {}
    test = recorded.get("test")
    if not test:
        return None
    out = dict(test)
    out["users"] = test.get("users", len(recorded.get("users", [])))
    out["beam"] = test.get("beam", recorded.get("beam"))
    out["ks"] = [int(k) for k in (recorded.get("ks") or test.get("k") or [])]
    return out
