"""The Decode page's latency comparison: the library's order timing
(:mod:`zerogr_core.bench.order_latency`, which ``compare-orders`` uses too) and the page's words
for its protocols and series."""
from ..bench.order_latency import (CPU_LOOP, GPU_EAGER, GPU_GRAPH, LATENCY_PROTOCOLS, ORDERS, STATIC_EAGER,
                                   STATIC_GRAPH, VALID_STATIC_GRAPH, VALID_TOKENS, Latency, LatencyProtocol, order_runs,
                                   time_orders, winner)

__all__ = ["CPU_LOOP", "GPU_EAGER", "GPU_GRAPH", "LATENCY_PROTOCOLS", "ORDERS", "PROTOCOL_LABELS", "SERIES_LABELS",
           "STATIC_EAGER", "STATIC_GRAPH", "VALID_STATIC_GRAPH", "VALID_TOKENS", "Latency", "LatencyProtocol",
           "order_runs", "time_orders", "winner"]

#: The protocols as the Decode page offers them.
PROTOCOL_LABELS = {"page": "≥ 20 runs and ≥ 1 s of work per order (a ranking that holds)",
                   "quick": "3 runs per order (a preview: the ranking may change)"}
#: The series the Decode page times, in its words (the orders by their own names).
SERIES_LABELS = {**{o: o for o in ORDERS}, VALID_TOKENS: "scoring first, valid tokens only (STATIC adapted)"}
