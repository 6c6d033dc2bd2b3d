"""Session set-up shared by every test module."""
import os
import sys

import torch

# The repository root must come first so that `import kernels` finds the repo's package,
# not the unrelated PyPI package of that name (plain `pytest` only adds tests/).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Triton picks interpreter or compiler when @triton.jit decorates a kernel, so the switch
# must be set before anything imports `kernels`. Without a GPU the kernels run in the
# interpreter on CPU tensors; with one they compile (export TRITON_INTERPRET to override).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Plans go to a per-session folder, never the user's ~/.cache/zerogr (a stored plan from an
# earlier run would otherwise skip the planning a test exercises); compiled kernels stay in
# Triton's usual cache, which only saves time.
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".triton", "cache"))
if not os.environ.get("ZEROGR_CACHE_DIR"):
    import atexit
    import shutil
    import tempfile

    os.environ["ZEROGR_CACHE_DIR"] = tempfile.mkdtemp(prefix="zerogr-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ZEROGR_CACHE_DIR"], ignore_errors=True)
