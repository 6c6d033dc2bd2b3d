"""A serving replica's work, without Ray: the model, its live catalog, batched decoding.

:class:`Recommender` holds the recommender model and a
:class:`~zerogr_core.serve.live.LiveCatalog` (index and decoder per catalog version). It
decodes a list of :class:`~zerogr_core.serve.schema.Query` at once: the batch runs on one
catalog version read at its start, split into runs of at most the largest planned batch
size and each run padded to a planned size (:mod:`.batching`). A request whose ids are not
in that version gets its own :class:`~zerogr_core.serve.schema.RequestError`; the others
are answered. The Ray deployment (:mod:`.app`) and ``decode-dataset`` (:mod:`.offline`)
both decode through it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..decode.store import CatalogStore
from ..errors import CatalogError, ZeroGRError
from .batching import chunks, pad, padded_size
from .config import ServeConfig
from .live import CatalogPush, LiveCatalog
from .schema import Query, RequestError


@dataclass(frozen=True)
class Answer:
    """Top items of one request.

    Attributes
    ----------
    items : list of int or str
        Item ids, best first (at most ``k``; fewer when fewer items are allowed).
    scores : list of float
        Their log-probabilities under the model.
    catalog_version : int
        The pushed label of the catalog version that decoded the request.
    rows : np.ndarray, shape (len(items),), int64
        Their rows in that version's catalog.
    """

    items: list
    scores: list
    catalog_version: int
    rows: np.ndarray

    def to_json(self) -> dict:
        return dict(items=self.items, scores=self.scores, catalog_version=self.catalog_version)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(checkpoint: str | None, device):
    """The recommender of ``checkpoint`` (``train-movielens`` or ``train`` output) on ``device``;
    ``None``: the bundled MovieLens model.

    Raises
    ------
    ZeroGRError
        Missing or foreign file, or weights of another model version.
    """
    if checkpoint is None:
        from ..recsys.movielens import bundled_study

        return bundled_study(device)
    from ..recsys.bundled import checkpoint_option

    # either trainer's, told by its format (a sequence checkpoint loads without Polars); a bad file is
    # one line naming --checkpoint, as in the commands that check it before starting replicas
    return checkpoint_option("--checkpoint", checkpoint, device=device)


def catalog_for_model(spec: str, study):
    """Open catalog ``spec`` (file or sample name) with the codebooks of ``study``'s model.

    Raises
    ------
    ZeroGRError
        A catalog that does not open, or whose SIDs do not fit the model's codebooks.
    """
    from ..catalog.samples import open_catalog
    from ..errors import CatalogError

    sizes = tuple(study.catalog.codebook_sizes)
    try:
        catalog = open_catalog(spec, codebook_sizes=sizes)
    except CatalogError as err:  # the sizes are the model's, not the user's: say so
        if err.column != "codebook_sizes" and not (err.row is not None and "codebook size" in err.reason):
            raise
        raise ZeroGRError(f"catalog {spec} does not fit the model: {err}") from None
    if tuple(catalog.codebook_sizes) != sizes:
        raise ZeroGRError(f"catalog {spec}: codebooks {'/'.join(map(str, catalog.codebook_sizes))} differ "
                          f"from the model's {'/'.join(map(str, sizes))}")
    return catalog


class Recommender:
    """The model and live catalog of one replica (or one rank of ``decode-dataset``).

    Parameters
    ----------
    config : ServeConfig
    device : str or torch.device, optional
        Default: CUDA when present, else the CPU.

    Notes
    -----
    :meth:`recommend` may be called from several threads: each call reads its catalog
    version once, and the decoder serialises what must be serialised (the GPU engine's
    static buffers; see :class:`~zerogr_core.decode.decoder.Decoder`).
    """

    def __init__(self, config: ServeConfig, device=None):
        self.config = config
        self.device = torch.device(device) if device is not None else default_device()
        self.study = load_model(config.checkpoint, self.device)
        self.heads = self.study.model.head_weights()
        # the bundled model's catalog under the name the app gives it
        self._own_catalog = self.study.catalog if config.checkpoint else \
            dataclasses.replace(self.study.catalog, name="movielens")
        self._sids = (None, None)
        self._steps = self._step_models()
        store = CatalogStore(self.open_catalog(None), self._make_decoder, device=self.device,
                             warmup=self._warmup if config.warmup else None)
        self.live = LiveCatalog(store, self.open_catalog)

    # ------------------------------------------------------------------ catalogs
    def open_catalog(self, spec: str | None):
        """A catalog for the model: ``spec`` (file or sample name), else the configured one,
        else the checkpoint's (see :func:`catalog_for_model`)."""
        spec = spec if spec is not None else self.config.catalog
        return self._own_catalog if spec is None else catalog_for_model(spec, self.study)

    def push(self, push: CatalogPush) -> int:
        """Serve the pushed catalog state (see :meth:`LiveCatalog.push`)."""
        return self.live.push(push)

    @property
    def catalog(self):
        """The catalog of the version now served."""
        return self.live.store.current.catalog

    def _make_decoder(self, catalog, index):
        from ..decode.decoder import Decoder

        engine = self.config.engine
        if engine == "auto" and self._steps is None and self.device.type == "cuda":
            engine = "eager"  # a hidden_fn per batch: the graph engine would capture a graph per batch
        return Decoder(index, self.heads, self.config.beam, catalog=catalog, engine=engine)

    def _step_models(self) -> dict | None:
        """One KV-cache step model per planned batch size, for a model that has one (the
        TIGER-style recommender); ``None``: batches decode through ``hidden_fn_for``.

        Prefilled at a fixed history length, a size's step model keeps the same static
        tensors from batch to batch, so the GPU engine replays the graph it captured at
        warm-up instead of capturing one per batch."""
        from ..recsys.model import SIDRecommender

        if not isinstance(self.study.model, SIDRecommender):
            return None
        from ..models.tiger import TigerStepModel

        return {size: TigerStepModel(self.study.model) for size in self.config.batch_sizes}

    def _model_input(self, histories: list, sids: torch.Tensor):
        """What the decoder reads for a padded batch of history rows: the size's step model,
        prefilled, or a ``hidden_fn``."""
        model = self.study.model
        if self._steps is None:
            return model.hidden_fn_for(histories, sids)
        from ..models.tiger import pack_histories

        size, longest = len(histories), model.config.max_history
        items, lengths = pack_histories(histories, longest)
        padded = torch.zeros(size, longest, dtype=torch.int64)
        padded[:, :items.shape[1]] = items  # causal encoder: right padding changes no item's state
        mask = torch.arange(longest)[None, :] < lengths[:, None]
        step_model = self._steps[size]
        step_model.prefill(sids[padded.to(sids.device)], mask, beam_width=self.config.beam)
        return step_model

    def _sids_of(self, catalog) -> torch.Tensor:
        held, sids = self._sids
        if held is not catalog:
            sids = torch.from_numpy(catalog.sids.astype(np.int64)).to(self.device)
            self._sids = (catalog, sids)
        return sids

    def _warmup(self, decoder) -> None:
        """Decode every planned batch size once, constrained like a request (plans and, on a
        GPU, compiles and captures each shape before the version serves)."""
        from ..decode.constraints import RequestLists

        sids = torch.from_numpy(decoder.catalog.sids.astype(np.int64)).to(self.device)
        first = decoder.catalog.item_ids[:1]
        for size in self.config.batch_sizes:
            history = [np.zeros(1, dtype=np.int64)] * size
            # the store runs this under its device lock, as recommend prefills and decodes; both
            # list forms a request takes: item ids (no deleted items) and rows (with the deleted ones)
            decoder.decode(self._model_input(history, sids), size, deny_items=[first] * size, normalise="catalog")
            decoder.decode(self._model_input(history, sids), size,
                           lists=RequestLists.from_rows(deny=history, normalise="catalog"))

    # ------------------------------------------------------------------ decoding
    def recommend(self, queries: list[Query]) -> list:
        """Answer ``queries`` together on one catalog version.

        Returns
        -------
        list of Answer or RequestError
            One per query, in order; a :class:`RequestError` (422) for ids not in the
            version's catalog.
        """
        store = self.live.store
        v = store.current
        out: list = [None] * len(queries)
        ready = []
        for i, q in enumerate(queries):
            try:
                history = v.catalog.rows_of(list(q.history), what="history")
                deny = v.catalog.rows_of(list(q.exclude), what="exclude") if q.exclude else np.zeros(0, np.int64)
                allow = v.catalog.rows_of(list(q.allow), what="allow") if q.allow is not None else None
            except CatalogError as err:
                out[i] = RequestError(str(err), status=422)
                continue
            if not q.keep_history:
                deny = np.union1d(deny, history)
            ready.append((i, history, deny, allow))
        sids = self._sids_of(v.catalog)
        for run in chunks(len(ready), self.config.max_batch):
            part = [ready[j] for j in run]
            size = padded_size(len(part), self.config.batch_sizes)
            rows = pad(part, size)
            allow = None  # no request with an allow list: the deny lists' path alone
            if any(r[3] is not None for r in rows):
                allow = [None if r[3] is None else v.catalog.item_ids[r[3]] for r in rows]
            with store.device_lock:  # a step model holds one batch: prefill and decode together
                done = store.decode(self._model_input([r[1] for r in rows], sids), size, allow_items=allow,
                                    deny_items=[v.catalog.item_ids[r[2]] for r in rows], snapshot=v,
                                    normalise="catalog")
            label = self.live.label(done.version)
            scores = done.result.scores.float().cpu()
            item_rows = done.result.item_rows.cpu()
            for b, (i, *_) in enumerate(part):
                order = torch.argsort(scores[b], descending=True, stable=True)
                order = order[torch.isfinite(scores[b][order])][:queries[i].k].numpy()
                out[i] = Answer(done.item_ids[b][order].tolist(), scores[b][order].tolist(), label,
                                item_rows[b].numpy()[order])
        return out
