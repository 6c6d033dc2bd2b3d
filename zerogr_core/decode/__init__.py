"""Decoders: filtering first, scoring first and unconstrained beam search."""
from .decoder import ENGINES, ORDERS, Decoder
from .heads import Heads
from .search import DecodeResult

__all__ = ["Decoder", "DecodeResult", "ENGINES", "Heads", "ORDERS"]
