"""Catalogs: the sorted SID table, its file formats and synthetic generators."""
from .catalog import Catalog, lcp_with_previous, level_names, lexsort_rows, token_dtype

__all__ = ["Catalog", "lcp_with_previous", "level_names", "lexsort_rows", "token_dtype"]
