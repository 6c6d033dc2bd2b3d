"""What every benchmark and serving record carries about the machine and the software."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
#: The folders whose Python sources :func:`source_digest` covers: the library, its clients and the kernels.
SOURCE_FOLDERS = ("zerogr_core", "kernels")


def gpu_driver() -> str:
    """The NVIDIA driver version: pynvml if importable, else nvidia-smi, else ``"n/a"``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - any failure falls through to the next source
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "n/a"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "n/a"


def _source_folders() -> dict:
    """The folders of :data:`SOURCE_FOLDERS` this process imports, by their name in the repository:
    ``kernels/`` is installed as the package ``zerogr_kernels``."""
    folders = {"zerogr_core": Path(__file__).resolve().parent}
    # located, not imported: this module sits below the kernels' layer and only reads their files
    spec = importlib.util.find_spec("zerogr_kernels")
    if spec is not None and spec.origin:
        folders["kernels"] = Path(spec.origin).resolve().parent
    return folders


@functools.lru_cache(maxsize=2)
def source_digest(root: Path | None = None) -> str:
    """A digest of the Python sources this process runs, independent of git.

    A record's ``git_commit`` names the checkout's HEAD, which a copy of the working tree (a lent
    GPU machine's) may not have moved with the files: there it reads an older commit
    ``+dirty``. The digest names the code itself: the SHA-256 of every ``*.py`` file under
    :data:`SOURCE_FOLDERS`, each as its path in the repository and its bytes, in path order
    (first 12 hex digits), so a checkout and an installed wheel of the same code agree. Computed
    once per process.

    Parameters
    ----------
    root : pathlib.Path, optional
        A repository root whose folders to read; default: the packages this process imports.

    Returns
    -------
    str
        ``"n/a"`` when no source is found.
    """
    folders = _source_folders() if root is None else {name: root / name for name in SOURCE_FOLDERS}
    h, found = hashlib.sha256(), False
    for name in SOURCE_FOLDERS:
        base = folders.get(name)
        for path in sorted(base.rglob("*.py")) if base is not None else ():
            found = True
            h.update(f"{name}/{path.relative_to(base).as_posix()}".encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:12] if found else "n/a"


def environment(device: torch.device) -> dict:
    """GPU name, driver, torch/triton/CUDA versions, host and TF32 settings, and the code's commit and
    :func:`source_digest`."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = "n/a"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = torch.cuda.get_device_name(device)
        extra = dict(gpu_memory_gb=round(props.total_memory / 2**30, 1), gpu_sms=props.multi_processor_count,
                     cuda=torch.version.cuda)
        driver = gpu_driver()
    else:
        gpu = "none (CPU run)"
        extra = dict(cuda=torch.version.cuda or "n/a")
        driver = gpu_driver() if torch.cuda.is_available() else "n/a"
    return dict(gpu=gpu, driver=driver, torch=torch.__version__, triton=triton_version,
                python=platform.python_version(), host_cpus=os.cpu_count(), platform=platform.platform(),
                tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32), git_commit=_git_commit(),
                source_digest=source_digest(),
                triton_interpret=os.environ.get("TRITON_INTERPRET", ""), **extra)



if __name__ == "__main__":   # python -m zerogr_core.environment: this checkout's source digest
    print(source_digest())
