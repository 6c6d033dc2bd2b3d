"""A user's own model on the Decode page: a ``transformers`` checkpoint folder below a data root.

The folder is what ``save_pretrained`` writes (``config.json`` and the weights) for a T5
(or another encoder–decoder) or a causal LM whose vocabulary holds the SID tokens:
level ``l``'s token ``t`` is vocabulary id ``token_offsets[l] + t``. The offsets come
from a ``zerogr.json`` beside the weights (``{"token_offsets": [...]}``) or from the page.
The model serves through the HF adapter (:class:`zerogr_core.models.hf.HFStepModel`), its
output projection becoming the decoders' shared head; requests are seeded random prompts
of the model's vocabulary. Like catalog files, folders are read only below the app's data
roots, and a refusal says nothing about what exists elsewhere.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..errors import ZeroGRError
from .requests import DecodeInputs

#: The file beside the weights that holds the SID token offsets.
OFFSETS_FILE = "zerogr.json"
#: Tokens per random prompt.
PROMPT_LENGTH = 8


@dataclass(frozen=True)
class ModelFolder:
    """A checkpoint folder below a data root.

    Attributes
    ----------
    path : str
        Resolved folder.
    fingerprint : str
        Size and modification time of its files (cache key).
    token_offsets : tuple of int or None
        From ``zerogr.json``, if the folder has one.
    """

    path: str
    fingerprint: str
    token_offsets: tuple[int, ...] | None = None


def model_folder(path_text: str, roots: Sequence[Path]) -> ModelFolder:
    """The checkpoint folder ``path_text`` names below one of ``roots`` (absolute or relative to a root).

    Raises
    ------
    ZeroGRError
        Empty text; no folder with a ``config.json`` there inside the roots (one answer for
        every such case); a ``zerogr.json`` that is not ``{"token_offsets": [ints]}``.
    """
    text = path_text.strip().strip('"').strip("'")
    if not text:
        raise ZeroGRError("model folder: give the path of a transformers checkpoint folder on the server")
    roots = [Path(r) for r in roots]
    typed = Path(text).expanduser()
    for candidate in [typed] if typed.is_absolute() else [root / typed for root in roots]:
        try:
            real = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if any(real.is_relative_to(root) for root in roots) and (real / "config.json").is_file():
            stats = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in real.iterdir() if p.is_file())
            return ModelFolder(str(real), str(hash(tuple(stats))), _offsets_file(real))
    raise ZeroGRError(f"model folder: no transformers checkpoint (a folder with config.json) at that path inside "
                      f"the data folders {', '.join(map(str, roots))}")


def _offsets_file(folder: Path) -> tuple[int, ...] | None:
    path = folder / OFFSETS_FILE
    if not path.is_file():
        return None
    try:
        offsets = json.loads(path.read_text(encoding="utf-8"))["token_offsets"]
        return tuple(int(o) for o in offsets)
    except (OSError, ValueError, KeyError, TypeError):
        raise ZeroGRError(f"{OFFSETS_FILE}: expected {{\"token_offsets\": [first vocabulary id of each level]}}") \
            from None


def parse_offsets(text: str) -> tuple[int, ...]:
    """``"10, 266, 522"`` → ``(10, 266, 522)``.

    Raises
    ------
    ZeroGRError
        Naming the entry that is not a whole number.
    """
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise ZeroGRError("token offsets: give the vocabulary id of token 0 of each SID level, e.g. `10, 266, 522`")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        bad = next(p for p in parts if not p.lstrip("-").isdigit())
        raise ZeroGRError(f"token offsets: {bad!r} is not a whole number") from None


def load_model(folder: ModelFolder, device: str):
    """The checkpoint as a ``transformers`` model in eval mode on ``device`` (local files only).

    Raises
    ------
    ZeroGRError
        ``transformers`` cannot read it (its first line).
    """
    try:
        import transformers
    except ImportError:
        raise ZeroGRError("model folder: the transformers package is not installed") from None
    try:
        config = transformers.AutoConfig.from_pretrained(folder.path, local_files_only=True)
        auto = transformers.AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) \
            else transformers.AutoModelForCausalLM
        model = auto.from_pretrained(folder.path, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ZeroGRError(f"model folder: transformers cannot load it ({first[:200]})") from None
    return model.to(device).eval()


def own_model_inputs(model, folder: ModelFolder, token_offsets: Sequence[int], catalog, device, batch: int,
                     beam: int, seed: int) -> DecodeInputs:
    """Heads and requests of the user's model: its output projection as a shared head with a
    band per level, and ``batch`` seeded random prompts through its step model.

    Raises
    ------
    ZeroGRError
        Offsets that do not fit the catalog's levels and the model's vocabulary.
    """
    from ..models.hf import HFStepModel, check_vocabulary, output_head

    _, _, weight = output_head(model)
    offsets = check_vocabulary(int(weight.shape[0]), catalog.codebook_sizes, token_offsets)
    step_model = HFStepModel(model, offsets)
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, int(weight.shape[0]), (batch, PROMPT_LENGTH), generator=generator)
    step_model.prefill(prompts.to(device), beam_width=beam)
    return DecodeInputs(weight.detach(), offsets, step_model,
                        ("own", folder.path, folder.fingerprint, offsets, batch, seed, beam))
