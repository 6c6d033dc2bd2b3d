"""The MovieLens quality study: filtering first vs scoring first on a trained recommender.

Modules, in pipeline order:

* :mod:`.data` - MovieLens loaders (ml-latest-small, ML-1M, ML-100K) and the
  leave-one-out split;
* :mod:`.semantic_ids` - item embeddings, RQ-KMeans and the collision level;
* :mod:`.model` - the TIGER-style recommender whose heads and ``hidden_fn`` feed
  :class:`zerogr_core.Decoder`;
* :mod:`.train` - training, the checkpoint format and its loader;
* :mod:`.validity` and :mod:`.quality` - the study's metrics and invalid mass;
* :mod:`.commands` - the ``train-movielens`` and ``quality`` CLI commands;
* :mod:`.movielens`, :mod:`.beauty` (on :mod:`.bundled`) - the bundled MovieLens and Amazon
  Beauty recommenders and their test users, which the app, serving and the CLI share.

Submodules are imported on demand: :mod:`.data` needs Polars, while :mod:`.model` (the
decoding path) needs torch and numpy only.
"""
