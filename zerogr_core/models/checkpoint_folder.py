"""A user's own model: a ``transformers`` checkpoint folder whose vocabulary holds the SID tokens.

The folder is what ``save_pretrained`` writes (``config.json`` and the weights) for a T5
(or another encoder–decoder) or a causal LM. Level ``l``'s token ``t`` is vocabulary id
``token_offsets[l] + t``; the offsets come from a ``zerogr.json`` beside the weights
(``{"token_offsets": [...]}``) or from the caller. The model serves through the HF
adapter (:class:`~zerogr_core.models.hf.HFStepModel`), its output projection becoming the
decoders' shared head with one band per level.

One loader for every client: the Decode page (folders below the app's data roots only) and
the ``compare-orders`` command (any folder) both read checkpoints through this module.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..arg_types import to_int
from ..errors import ZeroGRError
from .hf import HFStepModel, check_vocabulary, output_head

#: The file beside the weights that holds the SID token offsets.
OFFSETS_FILE = "zerogr.json"
#: Tokens per random prompt.
PROMPT_LENGTH = 8


@dataclass(frozen=True)
class ModelFolder:
    """A checkpoint folder.

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


def model_folder(path_text: str, roots: Sequence[Path] | None = None, what: str = "model folder") -> ModelFolder:
    """The checkpoint folder ``path_text`` names.

    Parameters
    ----------
    path_text : str
        The folder, as typed (surrounding quotes and blanks are dropped).
    roots : sequence of Path, optional
        When given, only folders inside them are read: ``path_text`` is absolute or relative
        to a root, and a refusal says nothing about what exists outside them (the app's
        data roots). ``None``: any folder, relative to the working directory.
    what : str
        How error messages name the input (e.g. ``"--model"``).

    Raises
    ------
    ZeroGRError
        Empty text; no folder with a ``config.json`` there (inside the roots: one answer
        for every such case); a ``zerogr.json`` that is not ``{"token_offsets": [ints]}``.
    """
    text = path_text.strip().strip('"').strip("'")
    if not text:
        raise ZeroGRError(f"{what}: give the path of a transformers checkpoint folder")
    try:
        typed = Path(text).expanduser()
    except RuntimeError:  # ``~name`` of no user: a path like any other that names nothing
        typed = Path(text)
    if roots is None:
        candidates, allowed = [typed], None
    else:
        allowed = [Path(r) for r in roots]
        candidates = [typed] if typed.is_absolute() else [root / typed for root in allowed]
    for candidate in candidates:
        try:
            real = candidate.resolve(strict=True)
        except (OSError, RuntimeError, ValueError):  # ValueError: a NUL byte, which no file name holds
            continue
        inside = allowed is None or any(real.is_relative_to(root) for root in allowed)
        if inside and (real / "config.json").is_file():
            stats = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in real.iterdir() if p.is_file())
            return ModelFolder(str(real), str(hash(tuple(stats))), _offsets_file(real))
    where = (f"inside the data folders {', '.join(map(str, allowed))}" if allowed is not None
             else f"at {text}")
    raise ZeroGRError(f"{what}: no transformers checkpoint (a folder with config.json) {where}")


def _offsets_file(folder: Path) -> tuple[int, ...] | None:
    path = folder / OFFSETS_FILE
    if not path.is_file():
        return None
    expected = f"{path}: expected {{\"token_offsets\": [first vocabulary id of each level]}}"
    try:
        offsets = json.loads(path.read_text(encoding="utf-8"))["token_offsets"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ZeroGRError(expected) from None
    if not isinstance(offsets, list) or not offsets:
        raise ZeroGRError(expected)
    # Each entry as the command line's would be: int() truncated 10.7 to 10, read true as 1 and
    # raised OverflowError (a traceback) on JSON's Infinity.
    return tuple(_offset(str(o), f"{path}: token_offsets") for o in offsets)


def _offset(text: str, what: str) -> int:
    """One token offset: a whole number ≥ 0 (:func:`~zerogr_core.arg_types.to_int`)."""
    try:
        return to_int(text, least=0)
    except ValueError as err:
        raise ZeroGRError(f"{what}: {err}") from None


def parse_offsets(text: str, what: str = "token offsets") -> tuple[int, ...]:
    """``"10, 266, 522"`` → ``(10, 266, 522)``.

    Raises
    ------
    ZeroGRError
        No entry, or naming the entry that is not a whole number ≥ 0.
    """
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise ZeroGRError(f"{what}: give the vocabulary id of token 0 of each SID level, e.g. `10, 266, 522`")
    return tuple(_offset(p, what) for p in parts)


def load_model(folder: ModelFolder, device, what: str = "model folder"):
    """The checkpoint as a ``transformers`` model in eval mode on ``device`` (local files only).

    An encoder–decoder config (``is_encoder_decoder``) loads as a sequence-to-sequence LM,
    any other as a causal LM.

    Raises
    ------
    ZeroGRError
        ``transformers`` is missing or cannot read the folder (its first line).
    """
    try:
        import transformers
    except ImportError:
        raise ZeroGRError(f"{what}: the transformers package is not installed") from None
    bars = transformers.utils.logging
    shown = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()   # a local folder loads at once; a bar would only crowd stderr
    try:
        config = transformers.AutoConfig.from_pretrained(folder.path, local_files_only=True)
        auto = transformers.AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) \
            else transformers.AutoModelForCausalLM
        model = auto.from_pretrained(folder.path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - whatever the loader (or safetensors) raises on the user's files
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ZeroGRError(f"{what}: transformers cannot load it ({first[:200]})") from None
    finally:
        if shown:
            bars.enable_progress_bar()
    return model.to(device).eval()


@dataclass(frozen=True, eq=False)
class CheckpointModel:
    """A loaded ``transformers`` model as the decoders take it.

    Attributes
    ----------
    head : torch.Tensor, shape (vocab, H)
        The output projection (detached): the decoders' shared head.
    token_offsets : tuple of int
        Band offset of each SID level in ``head``, checked against the vocabulary.
    step_model : HFStepModel
        Computes the hidden states; prefill it with :meth:`prefill_random`.
    """

    head: torch.Tensor
    token_offsets: tuple[int, ...]
    step_model: HFStepModel

    @property
    def vocab_size(self) -> int:
        return int(self.head.shape[0])

    def prefill_random(self, batch: int, beam_width: int, seed: int, length: int = PROMPT_LENGTH) -> torch.Tensor:
        """Prefill the step model with ``batch`` seeded random prompts of the whole vocabulary.

        The prompts depend on ``seed``, ``batch`` and the vocabulary only, so every order
        (and every rerun) decodes the same requests.

        Returns
        -------
        torch.Tensor, shape (batch, length), int64
            The prompts, on the CPU.
        """
        generator = torch.Generator().manual_seed(seed)
        prompts = torch.randint(0, self.vocab_size, (batch, length), generator=generator)
        self.step_model.prefill(prompts.to(self.step_model.device), beam_width=beam_width)
        return prompts


def checkpoint_model(model, token_offsets: Sequence[int], codebook_sizes: Sequence[int]) -> CheckpointModel:
    """Head, checked offsets and step model of a loaded ``transformers`` model.

    Raises
    ------
    ZeroGRError
        No usable output projection (:func:`~zerogr_core.models.hf.output_head`), or
        offsets that do not fit the catalog's levels and the model's vocabulary
        (:func:`~zerogr_core.models.hf.check_vocabulary`).
    """
    _, _, weight = output_head(model)
    offsets = check_vocabulary(int(weight.shape[0]), codebook_sizes, token_offsets)
    return CheckpointModel(weight.detach(), offsets, HFStepModel(model, offsets))
