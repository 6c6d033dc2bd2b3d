"""The step-sliced index, its builders, and the baseline indexes."""
from .builders import BUILDERS, build_index, build_phases, h2d_gbps
from .host_trie import HostTrie
from .layout import INDEX_PRESETS, IndexConfig, StepIndex, StepMapping, dense_bytes, sparse_bytes, static_style_bytes
from .static_style import StaticIndex, build_static_index

__all__ = ["BUILDERS", "build_index", "build_phases", "dense_bytes", "h2d_gbps", "HostTrie", "INDEX_PRESETS",
           "IndexConfig", "sparse_bytes", "StepIndex", "StepMapping", "StaticIndex", "build_static_index",
           "static_style_bytes"]
