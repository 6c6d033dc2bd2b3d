"""The step-sliced index, its builders, and the baseline indexes."""
from .builders import BUILDERS, build_index
from .host_trie import HostTrie
from .layout import INDEX_PRESETS, IndexConfig, StepIndex, StepMapping, static_style_bytes
from .static_style import StaticIndex, build_static_index

__all__ = ["BUILDERS", "build_index", "HostTrie", "INDEX_PRESETS", "IndexConfig", "StepIndex", "StepMapping",
           "StaticIndex", "build_static_index", "static_style_bytes"]
