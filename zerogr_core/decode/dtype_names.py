"""The dtypes of the random heads and requests (:mod:`.random_requests`) by name, without torch,
so that a command checks its ``--dtype`` before it loads torch and the kernels."""
from __future__ import annotations

from ..errors import ZeroGRError

#: The dtype names :func:`~.random_requests.resolve_dtype` takes, in the order its error lists them.
DTYPE_NAMES = ("float32", "bfloat16", "float16")


def check_dtype_name(name: str) -> str:
    """``name`` when it is one of :data:`DTYPE_NAMES`.

    Parameters
    ----------
    name : str

    Returns
    -------
    str

    Raises
    ------
    ZeroGRError
        ``dtype must be one of float32, bfloat16, float16, got 'fp8'``.
    """
    if name not in DTYPE_NAMES:
        raise ZeroGRError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {name!r}")
    return name
