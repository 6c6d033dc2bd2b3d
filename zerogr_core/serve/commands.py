"""CLI commands ``serve`` (a Ray Serve deployment) and ``decode-dataset`` (offline, sharded).

:func:`register` adds both to ``python -m zerogr_core``. Ray is imported by ``serve``'s
handler only, so the CLI and ``decode-dataset`` work without it.
"""
from __future__ import annotations

import argparse
import signal
import time

from ..arg_types import number, whole, wholes
from ..errors import UsageError, ZeroGRError, first_line
from .batching import MAX_BATCH_WAIT_S

RAY_MISSING = ("the serve command needs Ray Serve: pip install 'ray[serve]==2.60.0' (pinned in requirements.txt; "
               "`make install` installs it)")


def register(subparsers) -> None:
    """Add ``serve`` and ``decode-dataset`` to the CLI's ``subparsers``."""
    p = subparsers.add_parser("serve", help="serve recommendations over HTTP with Ray Serve (one replica per GPU)",
                              description="Start (or join, --address) a Ray cluster and serve POST /recommend, "
                                          "GET /health and GET /metrics until interrupted.")
    _model_arguments(p)
    p.add_argument("--replicas", type=whole(1), default=None,
                   help="replicas (default: one per GPU of the cluster, else 1)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1; 0.0.0.0 opens it to "
                                                       "the network)")
    p.add_argument("--port", type=whole(1, 65535), default=8000, help="HTTP port (default 8000)")
    p.add_argument("--batch-wait-ms", type=number(0, MAX_BATCH_WAIT_S * 1e3, unit="milliseconds"), default=None,
                   help="how long a batch waits to fill, 0…10000 ms (default 5)")
    p.add_argument("--address", default=None, help="Ray cluster to join (e.g. auto, or ray://HOST:10001); "
                                                   "default: start a local one")
    p.add_argument("--llm", default=None, metavar="PRESET",
                   help="serve the Qwen3 recommender instead (tiny: CPU; qwen3-1.7b: GPU, bf16; random weights "
                        "unless --checkpoint names a transformers Qwen3 folder): POST /generate (SGLang-style), "
                        "POST /recommend, GET /ready, GET /health, GET /metrics (Prometheus)")
    p.add_argument("--token-offsets", type=wholes(0), default=None, metavar="O1,O2,…",
                   help="with --llm and --checkpoint: vocabulary id of token 0 of each SID level")
    p.add_argument("--projections", choices=("model", "fp8"), default=None,
                   help="with --llm: the layers' weight GEMMs in the model's dtype (model, the default) or in "
                        "float8 with row scales (fp8: bfloat16 models on GPUs of compute capability 8.9+)")
    p.add_argument("--partial-last-step", action=argparse.BooleanOptionalAction, default=None,
                   help="with --llm: the last step's layers on the beams whose prefix holds more than one item "
                        "only (default: on; the same items)")
    p.set_defaults(handler=run_serve)

    d = subparsers.add_parser("decode-dataset", help="top-K recommendations for every user, sharded over GPUs "
                                                     "with torch.distributed (run under torchrun)",
                              description="Decode every user of --input (default: the bundled MovieLens test "
                                          "users). Under `torchrun --nproc-per-node G` each rank decodes a block "
                                          "of users on its GPU (NCCL; gloo on CPUs) and rank 0 writes the "
                                          "gathered results.")
    _model_arguments(d)
    d.add_argument("--input", metavar="FILE", help='JSON lines {"user": ..., "history": [item ids]}, or one JSON object '
                                                   '{user: [item ids]} (default: the bundled MovieLens test users; '
                                                   "needs the bundled model)")
    d.add_argument("--users", type=whole(1), default=None, help="only the first N users")
    d.add_argument("--k", type=whole(1), default=10, help="items per user (default 10, at most the beam width)")
    d.add_argument("--keep-history", action="store_true", help="allow the history's items in the results")
    d.add_argument("--out", required=True, metavar="FILE", help="results, JSON lines (.jsonl); a summary goes "
                                                                "to FILE.summary.json")
    d.set_defaults(handler=run_decode_dataset)


def _model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", metavar="FILE", help="recommender checkpoint (default: the bundled MovieLens "
                                                        "model)")
    p.add_argument("--catalog", metavar="CATALOG", help="catalog to serve (file or sample name; SIDs within the "
                                                        "model's codebooks; default: the checkpoint's)")
    p.add_argument("--preset", choices=("cpu", "gpu"), default=None,
                   help="beam and batch sizes: gpu (beam 128, batches 1…64) or cpu (beam 32, batches 1…16); "
                        "default: gpu when CUDA is present")
    p.add_argument("--beam", type=whole(1), default=None, help="beam width M, the largest k (default: the preset's)")
    p.add_argument("--batch-sizes", type=wholes(1), default=None, metavar="B1,B2,…",
                   help="planned batch sizes (default: the preset's); decode-dataset uses the largest")
    p.add_argument("--engine", choices=("auto", "reference", "graph", "eager"), default=None,
                   help="decoder engine (default auto: on CUDA the GPU engine, CUDA graphs when the model has "
                        "a KV-cache step model; the reference path on CPU)")


def config_from_args(args: argparse.Namespace, check_device: bool = True, **changes):
    """The :class:`~.config.ServeConfig` of the model arguments (``check_device``: the GPU
    engine needs CUDA on this machine)."""
    import torch

    from .config import ServeConfig

    preset = args.preset or ("gpu" if torch.cuda.is_available() else "cpu")
    if args.beam is not None:
        changes["beam"] = args.beam
    if args.batch_sizes is not None:
        changes["batch_sizes"] = tuple(args.batch_sizes)
    for option in ("checkpoint", "catalog", "engine"):
        value = getattr(args, option)
        if value is not None:
            changes[option] = value
    try:
        config = ServeConfig.preset(preset, **changes)
    except ZeroGRError as err:
        raise UsageError(str(err)) from None
    _check_shapes(config)
    if check_device and config.engine in ("graph", "eager") and not torch.cuda.is_available():
        raise UsageError(f"--engine {config.engine} needs a CUDA GPU, and there is none "
                         "here; use --engine auto or reference")
    return config


def llm_config_from_args(args: argparse.Namespace, **changes):
    """The :class:`~.llm.LLMServeConfig` of ``--llm PRESET`` and the model arguments."""
    from .llm import LLMServeConfig

    if args.preset is not None or args.engine is not None:
        raise UsageError(f"--{'preset' if args.preset is not None else 'engine'}: not used with --llm (the "
                         "LLM preset sets beam and batch sizes; filtering first in the GPU engine)")
    if args.beam is not None:
        changes["beam"] = args.beam
    if args.batch_sizes is not None:
        changes["batch_sizes"] = tuple(args.batch_sizes)
    if args.catalog is not None:
        changes["catalog"] = args.catalog
    if args.checkpoint is not None:
        changes["checkpoint"] = args.checkpoint
    if args.token_offsets is not None:
        changes["token_offsets"] = tuple(args.token_offsets)
    if args.projections is not None:
        changes["projections"] = args.projections
    if args.partial_last_step is not None:
        changes["partial_last_step"] = args.partial_last_step
    try:
        config = LLMServeConfig.preset(args.llm, **changes)
    except ZeroGRError as err:
        raise UsageError(f"--llm {args.llm}: {err}") from None
    _check_shapes(config)
    from pathlib import Path

    if config.checkpoint is not None and not Path(config.checkpoint).is_dir():
        raise UsageError(f"--checkpoint {config.checkpoint}: no such folder (a transformers Qwen3 checkpoint)")
    return config


def _check_shapes(config) -> None:
    """Refuse a largest planned batch × beam over what one decode of a command may hold
    (:func:`~zerogr_core.decode.work_limits.check_beams`), as every decoding command does: a
    replica pads each batch to a planned size, so ``decode-dataset --beam 100000`` decoded 1.6
    million beams per call for three users and ran for hours."""
    from ..decode.work_limits import check_beams

    check_beams(config.batch_sizes, config.beam, "--batch-sizes × --beam")


def run_serve(args: argparse.Namespace) -> int:
    port, replicas = args.port, args.replicas
    changes = {}
    if args.batch_wait_ms is not None:
        changes["batch_wait_s"] = args.batch_wait_ms / 1e3
    if args.llm is not None:
        config = llm_config_from_args(args, **changes)
    else:
        if args.token_offsets is not None:
            raise UsageError("--token-offsets: only with --llm")
        if args.projections is not None:
            raise UsageError("--projections: only with --llm")
        if args.partial_last_step is not None:
            raise UsageError(f"--{'' if args.partial_last_step else 'no-'}partial-last-step: only with --llm")
        config = config_from_args(args, check_device=args.address is None, **changes)
    _check_port(args.host, port)
    if args.llm is None:
        _check_model(config)
    elif args.catalog is not None and not args.catalog.startswith("synth:"):
        _check_catalog(config.catalog)
    try:
        from . import app
    except ImportError as err:
        raise ZeroGRError(f"{RAY_MISSING} ({err})") from None
    try:
        replicas, gpus = app.start(config, replicas=replicas, host=args.host, port=port, address=args.address)
    except Exception as err:  # Ray's errors span many lines: one line, and nothing left running
        app.shutdown()
        first = first_line(err)
        raise ZeroGRError(f"Ray Serve did not start: {type(err).__name__}: {first}") from None
    where = f"http://{args.host}:{port}"
    routes = f"POST {where}/recommend, GET {where}/health, GET {where}/metrics"
    if args.llm is not None:
        routes = (f"Qwen3 {config.model} ({config.weights} weights), POST {where}/generate, {routes}, GET {where}/ready "
                  "(200 once loaded and warmed)")
    print(f"serving {replicas} replica(s) ({'one GPU each' if gpus else 'CPU'}), beam {config.beam}, batch sizes "
          f"{'/'.join(map(str, config.batch_sizes))}: {routes} (Ctrl-C stops)", flush=True)
    # a service manager stops with SIGTERM: shut Serve down as on Ctrl-C
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopping", flush=True)
    finally:
        app.shutdown()
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _check_port(host: str, port: int) -> None:
    import socket

    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as err:
        raise UsageError(f"--host {host} --port {port}: cannot listen there ({err.strerror or err})") from None


def _check_model(config) -> None:
    """Load the model and catalog once here, so that a bad --checkpoint or --catalog is one
    line on the terminal rather than a replica that fails to start."""
    from .recommender import catalog_for_model, load_model

    study = load_model(config.checkpoint, "cpu")
    if config.catalog is not None:
        catalog_for_model(config.catalog, study)


def _check_catalog(spec: str) -> None:
    """Open a catalog file or sample given to ``--llm`` once here, so that a bad one is one line on
    the terminal rather than a replica that fails to start (whether its codebooks fit the model's
    SID bands needs the model, which only the replica loads)."""
    from ..catalog.samples import open_catalog

    try:
        open_catalog(spec)
    except ZeroGRError as err:
        raise ZeroGRError(f"--catalog: {err}") from None


def run_decode_dataset(args: argparse.Namespace) -> int:
    # the configuration keeps each size once, as set() does; checked before torch loads (config_from_args)
    if args.batch_sizes is not None and len(set(args.batch_sizes)) > 1:
        raise UsageError("--batch-sizes: decode-dataset plans one batch size; give one")
    from .offline import decode_dataset

    config = config_from_args(args)
    config = config.__class__.from_dict(dict(config.to_dict(), batch_sizes=[config.max_batch]))
    if args.k > config.beam:
        raise UsageError(f"--k: {args.k} is over the beam width {config.beam} (a decode returns at most --beam items)")
    if args.input is None and args.checkpoint is not None:
        raise UsageError("--input FILE is required with --checkpoint (the default users belong to the bundled model)")
    decode_dataset(config, args.out, users_file=args.input, count=args.users, k=args.k,
                   keep_history=args.keep_history)
    return 0
