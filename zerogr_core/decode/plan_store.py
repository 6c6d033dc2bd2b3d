"""Plans on disk, so that a known serving shape starts without timing anything.

A plan is stored as one JSON file per key in a folder (default
``~/.cache/zerogr/plans/``; ``ZEROGR_CACHE_DIR`` moves the whole cache, a
:class:`PlanStore` argument or ``--plan-dir`` one store). The key holds everything the
timings depend on:

* the machine: GPU name and compute capability (``cpu`` without one), driver, CUDA,
  torch and Triton versions;
* the catalog's statistics, not its contents: items, codebooks, and per step the
  representation, codebook, states, entries, longest segment and token dtype, plus the
  head layout (shared head and band offsets);
* the shape: batch, beam width, dtype, hidden size;
* the planner's settings: top-k paths, plan override and cost model.

The file name is a digest of the key, and the file repeats the key, so a file is only
used for exactly its key. A file that cannot be read, parsed or matched is ignored with a
warning and replaced at the next save; nothing here raises on a bad file.

Triton's own compilation cache sits beside the plans (``<cache>/triton``) unless the user
set ``TRITON_CACHE_DIR``, so that a second process on the machine compiles nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import warnings
from pathlib import Path

import torch

FORMAT = 1
DISABLE_VALUES = ("0", "off", "false", "no")


def cache_root() -> Path:
    """``ZEROGR_CACHE_DIR``, else ``$XDG_CACHE_HOME/zerogr``, else ``~/.cache/zerogr``."""
    env = os.environ.get("ZEROGR_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zerogr"


def use_project_triton_cache() -> str:
    """Point Triton's cache at ``<cache root>/triton`` unless ``TRITON_CACHE_DIR`` is set; return the folder.

    Triton reads the variable when it compiles, so this must run before the first
    compilation of the process (the engine calls it when it is built).
    """
    if not os.environ.get("TRITON_CACHE_DIR"):
        os.environ["TRITON_CACHE_DIR"] = str(cache_root() / "triton")
    return os.environ["TRITON_CACHE_DIR"]


def device_fingerprint(device: torch.device) -> dict:
    """What the timings of a plan depend on, machine side."""
    import triton

    out = dict(torch=torch.__version__, triton=triton.__version__)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        try:
            driver = int(torch._C._cuda_getDriverVersion())
        except (AttributeError, RuntimeError):  # not exposed by every torch build
            driver = None
        out.update(gpu=props.name, capability=f"{props.major}.{props.minor}", driver=driver,
                   cuda=torch.version.cuda)
    else:
        out.update(gpu="cpu", cpu=platform.processor() or platform.machine(),
                   interpreter=os.environ.get("TRITON_INTERPRET") == "1")
    return out


def catalog_fingerprint(index, heads) -> dict:
    """The index's shape statistics (no hash of its tables: O(levels), not O(items))."""
    steps = []
    for s in index.steps:
        table = s.table if s.kind == "dense" else s.tokens
        steps.append(dict(kind=s.kind, codebook=int(s.codebook), states=int(s.n_states), entries=int(s.n_entries),
                          max_segment=int(s.max_segment),
                          dtype=None if table is None else str(table.dtype).replace("torch.", "")))
    return dict(items=int(index.n_items), codebooks=[int(v) for v in index.codebook_sizes], steps=steps,
                shared_head=heads.shared is not None, band_offsets=[int(b) for b in heads.band_offsets])


class PlanStore:
    """A folder of plan files.

    Parameters
    ----------
    folder : str or Path, optional
        Default: ``<cache root>/plans`` (:func:`cache_root`).
    """

    def __init__(self, folder=None):
        self.folder = Path(folder).expanduser() if folder is not None else cache_root() / "plans"

    def __repr__(self) -> str:
        return f"PlanStore({str(self.folder)!r})"

    @staticmethod
    def digest(key: dict) -> str:
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]

    def path(self, key: dict) -> Path:
        return self.folder / f"{self.digest(key)}.json"

    def load(self, key: dict) -> dict | None:
        """The stored plan (``Plan.to_dict`` form) for ``key``, or ``None``; a bad file warns."""
        path = self.path(key)
        try:
            text = path.read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            warnings.warn(f"plan store: ignoring {path}: cannot read it ({exc})", stacklevel=2)
            return None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format') if isinstance(data, dict) else None!r}, "
                                 f"expected {FORMAT}")
            if data.get("key") != json.loads(json.dumps(key)):
                raise ValueError("its key differs from the shape asked for")
            plan = data["plan"]
            if not isinstance(plan, dict) or not isinstance(plan.get("steps"), list):
                raise ValueError("no plan steps")
            return plan
        except (ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"plan store: ignoring {path}: {exc}", stacklevel=2)
            return None

    def save(self, key: dict, plan: dict) -> Path | None:
        """Write ``plan`` for ``key`` atomically; returns the file, or ``None`` (with a warning) if
        the folder is not writable."""
        path = self.path(key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".plan-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(dict(format=FORMAT, key=key, plan=plan), f, indent=1)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except OSError as exc:
            warnings.warn(f"plan store: cannot write {path}: {exc}", stacklevel=2)
            return None
        return path

    def entries(self) -> list[dict]:
        """Every readable stored plan file: ``{"path", "key", "plan"}`` (bad files skipped)."""
        out = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                out.append(dict(path=str(path), key=data["key"], plan=data["plan"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out


def resolve_store(store) -> PlanStore | None:
    """``"default"`` -> the default store (``None`` when ``ZEROGR_PLAN_STORE`` is off); ``False``/``None``
    -> no store; a path -> a store there; a :class:`PlanStore` as is."""
    if store is None or store is False:
        return None
    if isinstance(store, PlanStore):
        return store
    if store == "default":
        if os.environ.get("ZEROGR_PLAN_STORE", "").strip().lower() in DISABLE_VALUES:
            return None
        return PlanStore()
    return PlanStore(store)
