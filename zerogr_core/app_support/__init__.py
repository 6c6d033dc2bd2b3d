"""Small non-UI helpers of the Streamlit app (``app.py`` and ``pages/``).

Everything here is plain Python on top of :mod:`zerogr_core` — no Streamlit import — so it
is unit-tested directly:

* :mod:`.resources` — one live heavy object per slot, released (GPU memory freed) when replaced;
* :mod:`.sources` — catalog sources (bundled samples, uploads, server files) and their loading;
* :mod:`.requests` — what a page decodes: random requests or a bundled recommender's test users;
* :mod:`.profile` — a stage-timed decode of either order, overlap@K and Recall@K;
* :mod:`.latency` — the page's words for the library's order timing (:mod:`zerogr_core.bench.order_latency`:
  both orders timed in turns until the ranking holds, and the winner beyond noise);
* :mod:`.own_model` — the user's ``transformers`` checkpoint folder as the Decode page's model
  (loaded by :mod:`zerogr_core.models.checkpoint_folder`, as ``compare-orders`` loads it);
* :mod:`.llm_model` — the Qwen3 shapes (random weights) as the Decode page's LLM-scale model;
* :mod:`.item_sets` — a decode restricted to an item set (the cold-start items) on both orders;
* :mod:`.labels` — item labels for catalogs without titles;
* :mod:`.density` — catalog-level and beam-weighted density, wasted logits;
* :mod:`.charts` — the tables and Plotly figures of the pages (and of ``docs/analysis.ipynb``);
* :mod:`.rebuild` — catalog refresh and rebuild-while-decoding;
* :mod:`.gpu` — NVML and torch memory readings;
* :mod:`.cpu_decode_orders` — the Decode page's CPU figures, measured
  (``python -m zerogr_core.app_support.cpu_decode_orders``).

The bundled recommenders the pages decode with are the studies'
(:mod:`zerogr_core.recsys.movielens`, :mod:`zerogr_core.recsys.beauty`); how much decode work
one page run may start is the library's (:mod:`zerogr_core.decode.work_limits`), which the
``compare-orders`` command applies too.
"""
