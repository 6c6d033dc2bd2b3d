"""The bundled Amazon Beauty recommender (a T5, ``tiger`` preset) and its test users, for the app.

The counterpart of :mod:`.movielens` for the Beauty catalog: its checkpoint as a
:class:`.bundled.BundledRecommender` (a missing or foreign checkpoint gives one clear
message), and the leave-one-out test requests as :class:`.movielens.TestUsers`.
"""
from __future__ import annotations


import numpy as np

from . import bundled
from .movielens import TestUsers

#: The bundled data set (and the name of its app sample).
DATASET = "amazon-beauty"
MISSING = ("the bundled Amazon Beauty recommender (sample_catalogs/amazon-beauty/model.pt) is not there; train it "
           "with `python -m zerogr_core train --dataset amazon-beauty --preset tiger --out "
           "sample_catalogs/amazon-beauty/model.pt`, or pick the random head")
#: Environment variable naming another checkpoint (a model trained with ``train --dataset amazon-beauty``).
CHECKPOINT_ENV = "ZEROGR_BEAUTY_CHECKPOINT"
MODEL = bundled.BundledRecommender(CHECKPOINT_ENV, ".seqrec:BEAUTY_CHECKPOINT",
                                   ".seqrec:load_sequence_checkpoint", MISSING,
                                   "python -m zerogr_core train --dataset amazon-beauty --preset tiger")
checkpoint_path = MODEL.checkpoint_path
available = MODEL.available
bundled_study = MODEL.study


def test_users(study) -> TestUsers:
    """Test requests (history = training items + validation item) of every Beauty user.

    Raises
    ------
    ZeroGRError
        The checkpoint was trained on other data.
    """
    from .data import leave_one_out
    from .seqrec import load_data, rows_for

    data = load_data(None, None, DATASET)
    split = leave_one_out(data)
    row_of_item = rows_for(study, data, checkpoint_path())
    histories = [row_of_item[split.history(u, "test")] for u in range(split.n_users)]
    try:
        user_ids = np.array([int(u) for u in data.user_ids], dtype=np.int64)
    except ValueError:  # non-numeric user names: number the users instead
        user_ids = np.arange(split.n_users, dtype=np.int64)
    titles = np.asarray(study.catalog.titles if study.catalog.titles is not None
                        else [str(i) for i in study.catalog.item_ids], dtype=object)
    return TestUsers(user_ids, histories, row_of_item[split.test_items].astype(np.int64), titles)
