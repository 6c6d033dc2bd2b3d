"""The step-sliced index, its builders, and the baseline indexes."""
from .builders import build_index, build_phases, h2d_gbps
from .config import BUILDERS, INDEX_PRESETS, IndexConfig, dense_bytes, sparse_bytes
from .host_trie import HostTrie
from .layout import StepIndex, StepMapping, static_style_bytes
from .static_style import StaticIndex, build_static_index

__all__ = ["BUILDERS", "build_index", "build_phases", "dense_bytes", "h2d_gbps", "HostTrie", "INDEX_PRESETS",
           "IndexConfig", "sparse_bytes", "StepIndex", "StepMapping", "StaticIndex", "build_static_index",
           "static_style_bytes"]
