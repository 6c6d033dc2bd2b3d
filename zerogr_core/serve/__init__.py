"""Serving at scale: a Ray Serve deployment and offline decoding sharded over GPUs.

Modules:

* :mod:`.config` - :class:`ServeConfig` (model, catalog, beam, planned batch sizes) and presets;
* :mod:`.schema` - the HTTP request body, validated into a :class:`~.schema.Query`;
* :mod:`.batching` - gathering requests (:class:`~.batching.Batcher`) and padding a batch to a planned size;
* :mod:`.live` - catalog versions pushed to a replica (:class:`~.live.CatalogPush`);
* :mod:`.recommender` - the replica's work without Ray: model, live catalog, batched decode;
* :mod:`.metrics` - latency histogram, batch sizes, queue length;
* :mod:`.llm` - the Qwen3 recommender replica (:class:`~.llm.LLMServeConfig` presets, :class:`~.llm.LLMRecommender`);
* :mod:`.generate` - SGLang-compatible ``/generate`` bodies and ``beam_results``;
* :mod:`.llm_service` - the Qwen3 replica's routes (``/generate``, ``/recommend``, ``/ready``, ``/metrics``);
* :mod:`.app` - the Ray Serve deployments (imports Ray);
* :mod:`.offline` - ``decode-dataset``: users sharded over ranks with ``torch.distributed``;
* :mod:`.commands` - the ``serve`` and ``decode-dataset`` CLI commands.

Only :mod:`.app` imports Ray, and only when a server starts: the package, the CLI and
the GPU path import without it.
"""
