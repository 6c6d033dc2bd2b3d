"""Hugging Face adapter (``transformers`` loads on first use): see :mod:`zerogr_core.models.hf`."""
from .models.hf import HFGenerator, HFStepModel, check_vocabulary, generate

__all__ = ["HFGenerator", "HFStepModel", "check_vocabulary", "generate"]
