"""The suite's name for :mod:`zerogr_core.environment` (serving's reports carry it too)."""
from ..environment import environment, gpu_driver

__all__ = ["environment", "gpu_driver"]
