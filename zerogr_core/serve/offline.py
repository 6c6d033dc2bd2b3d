"""``decode-dataset``: recommendations for a whole user set, sharded over ranks.

Under ``torchrun`` each rank (one per GPU; NCCL on GPUs, gloo on CPUs) decodes a
contiguous block of the users with its own :class:`~.recommender.Recommender`, the
results are gathered to rank 0 as fixed-size tensors (rows and scores, padded to the
largest block) and rank 0 writes them in input order, with a summary of the run. Without
``torchrun`` it is one process over all users. A rank's batches are padded to the one
planned batch size, as the server pads.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ZeroGRError
from .config import ServeConfig
from .schema import Query, RequestError, id_list


@dataclass(frozen=True)
class Users:
    """Who to decode for: a label and an item-id history per user, and optionally per user the
    item ids never to return (``excludes``) and the only ones to return (``allows``; ``None``:
    every item), as ``POST /recommend``'s ``exclude`` and ``allow``."""

    labels: list
    histories: list
    excludes: list | None = None
    allows: list | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int | None) -> "Users":
        if n is None:
            return self
        return Users(self.labels[:n], self.histories[:n], None if self.excludes is None else self.excludes[:n],
                     None if self.allows is None else self.allows[:n])

    def query(self, i: int, k: int, keep_history: bool) -> Query:
        """The request of user ``i``."""
        exclude = () if self.excludes is None else self.excludes[i]
        return Query(self.histories[i], k, exclude, keep_history, None if self.allows is None else self.allows[i])


def read_users(path: str | Path) -> Users:
    """Users of a JSON-lines file, one ``{"user": ..., "history": [item ids]}`` per line (with
    optional ``"exclude": [item ids]`` and ``"allow": [item ids]``, as ``POST /recommend`` takes
    them), or of one JSON object ``{user: [item ids], ...}`` (the interactions file ``train`` reads).
    A file that is one object of lists with a ``"history"`` key could be either, and is refused.

    Raises
    ------
    ZeroGRError
        Unreadable file, an ambiguous one, an entry that is not such a user, or an item id that is neither an integer
        (within 64 bits) nor a string (each named by its line or user, field and entry).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ZeroGRError(f"--input {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ZeroGRError(f"--input {path}: not UTF-8 text") from None
    whole = None
    if text.lstrip().startswith("{"):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # JSON lines: one object per line
    if isinstance(whole, dict) and "history" in whole and all(isinstance(v, list) for v in whole.values()):
        # One object of lists with a "history" key reads both ways: users {user: [ids]} with a user named
        # "history", or a single JSON-lines user without "user"; guessing dropped every other user.
        raise ZeroGRError(f"--input {path}: ambiguous: one JSON object whose values are all lists, with a "
                          "\"history\" key: give a JSON-lines user a \"user\" field, or rename the user "
                          "\"history\" of an interactions object {user: [item ids]}")
    if isinstance(whole, dict) and "history" not in whole:
        labels, histories = [], []
        for user, items in whole.items():
            if not isinstance(items, list) or not items:
                raise ZeroGRError(f"--input {path}, user {user!r}: expected a non-empty list of item ids")
            labels.append(user)
            histories.append(_ids(items, f"--input {path}, user {user!r}: history"))
        if not labels:
            raise ZeroGRError(f"--input {path}: no users")
        return Users(labels, histories)
    labels, histories, excludes, allows = [], [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as err:
            raise ZeroGRError(f"--input {path}, line {number}: not JSON ({err.msg})") from None
        if not isinstance(doc, dict) or "history" not in doc or not isinstance(doc["history"], list) \
                or not doc["history"]:
            raise ZeroGRError(f"--input {path}, line {number}: expected {{\"user\": ..., \"history\": [item ids]}} "
                              "with a non-empty history")
        for field in ("exclude", "allow"):
            if doc.get(field) is not None and not isinstance(doc[field], list):
                raise ZeroGRError(f"--input {path}, line {number}: {field} must be a list of item ids, "
                                  f"got {type(doc[field]).__name__}")
        where = f"--input {path}, line {number}: "
        labels.append(doc.get("user", number))
        histories.append(_ids(doc["history"], where + "history"))
        excludes.append(_ids(doc.get("exclude") or [], where + "exclude"))
        allows.append(None if doc.get("allow") is None else _ids(doc["allow"], where + "allow"))
    if not labels:
        raise ZeroGRError(f"--input {path}: no users")
    return Users(labels, histories, excludes, allows)


def _ids(items: list, field: str) -> tuple:
    """``items`` checked as POST /recommend checks an id list (integers or strings: the catalog is not
    loaded yet), with no length limit: whether each id is in the catalog is the decode's per-user check."""
    try:
        return id_list(items, field, string_ids=None, allow_empty=True, limit=None)
    except RequestError as err:
        raise ZeroGRError(str(err)) from None


def movielens_users(study) -> Users:
    """The leave-one-out test users of the bundled MovieLens data (visible histories), for
    the bundled model ``study``."""
    from ..recsys.movielens import test_users

    users = test_users(study)
    ids = study.catalog.item_ids
    return Users([int(u) for u in users.user_ids], [tuple(int(i) for i in ids[h]) for h in users.histories])


# ---------------------------------------------------------------------------- ranks
@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks."""

    rank: int
    world: int
    device: torch.device
    backend: str | None

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def join_ranks() -> Ranks:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1), else one rank."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world <= 1:
        return Ranks(0, 1, torch.device("cuda" if cuda else "cpu"), None)
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend)
    return Ranks(dist.get_rank(), dist.get_world_size(), torch.device(f"cuda:{local}" if cuda else "cpu"), backend)


def shard(n: int, rank: int, world: int) -> range:
    """Rank ``rank``'s contiguous block of ``n`` users (sizes differ by at most one)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def _gather(ranks: Ranks, tensor: torch.Tensor, rows: int) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (first dim padded to ``rows``), in rank order."""
    import torch.distributed as dist

    padded = torch.full((rows,) + tuple(tensor.shape[1:]), -1, dtype=tensor.dtype)
    padded[:tensor.shape[0]] = tensor
    padded = padded.to(ranks.device)
    out = [torch.empty_like(padded) for _ in range(ranks.world)]
    dist.all_gather(out, padded)
    return [t.cpu() for t in out]


# ---------------------------------------------------------------------------- run
def decode_dataset(config: ServeConfig, out: str | Path, *, users_file: str | None = None, count: int | None = None,
                   k: int = 10, keep_history: bool = False, log=print) -> dict | None:
    """Decode every user, sharded over the ranks; rank 0 writes ``out`` (JSON lines) and
    ``<out>.summary.json`` and returns the summary (other ranks return ``None``).

    Raises
    ------
    ZeroGRError
        Bad input file, ``k`` outside 1…beam, a model or catalog that does not load.
    """
    from .recommender import Recommender

    if not 1 <= k <= config.beam:
        raise ZeroGRError(f"--k must be within 1…{config.beam} (the beam width), got {k}")
    out = Path(out)
    if out.suffix != ".jsonl":
        raise ZeroGRError(f"--out {out}: write a .jsonl file")
    ranks = join_ranks()
    try:
        start = time.perf_counter()
        users = read_users(users_file) if users_file is not None else None  # a bad file fails before the model loads
        rec = Recommender(config, device=ranks.device)
        users = users if users is not None else movielens_users(rec.study)
        users = users.head(count)
        mine = shard(len(users), ranks.rank, ranks.world)
        queries = [users.query(i, k, keep_history) for i in mine]
        ready_s = time.perf_counter() - start
        t0 = time.perf_counter()
        answers = rec.recommend(queries) if queries else []
        if ranks.device.type == "cuda":
            torch.cuda.synchronize(ranks.device)
        decode_s = time.perf_counter() - t0
        rows = torch.full((len(mine), k), -1, dtype=torch.int64)
        scores = torch.full((len(mine), k), float("-inf"), dtype=torch.float64)
        errors = {}
        for j, a in enumerate(answers):
            if isinstance(a, RequestError):
                errors[mine[j]] = str(a)
                continue
            rows[j, :len(a.rows)] = torch.from_numpy(a.rows)
            scores[j, :len(a.scores)] = torch.tensor(a.scores, dtype=torch.float64)
        version = rec.live.version
        if ranks.distributed:
            import torch.distributed as dist

            largest = len(shard(len(users), 0, ranks.world))
            all_rows = _gather(ranks, rows, largest)
            all_scores = _gather(ranks, scores, largest)
            extras = [None] * ranks.world
            dist.all_gather_object(extras, dict(errors=errors, decode_s=decode_s, ready_s=ready_s))
            if ranks.rank != 0:
                return None
            parts = [shard(len(users), r, ranks.world) for r in range(ranks.world)]
            rows = torch.cat([t[:len(p)] for t, p in zip(all_rows, parts)])
            scores = torch.cat([t[:len(p)] for t, p in zip(all_scores, parts)])
            errors = {i: e for x in extras for i, e in x["errors"].items()}
            rank_decode = [x["decode_s"] for x in extras]
            rank_ready = [x["ready_s"] for x in extras]
        else:
            rank_decode, rank_ready = [decode_s], [ready_s]
        summary = _write(out, rec.catalog, users, rows.numpy(), scores.numpy(), errors, version)
        wall = time.perf_counter() - start
        from ..environment import environment

        summary.update(world_size=ranks.world, backend=ranks.backend or "none", device=str(ranks.device),
                       k=k, beam=config.beam, batch_size=config.max_batch, engine=config.engine,
                       keep_history=keep_history, rank_setup_s=[round(s, 3) for s in rank_ready],
                       rank_decode_s=[round(s, 3) for s in rank_decode], wall_s=round(wall, 3),
                       users_per_s_decode=round(len(users) / max(max(rank_decode), 1e-9), 2),
                       machine=environment(ranks.device))
        Path(str(out) + ".summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log(f"decoded {len(users):,} users on {ranks.world} rank(s) ({summary['backend']}, {ranks.device.type}): "
            f"slowest rank {max(rank_decode):.2f} s, {summary['users_per_s_decode']:,} users/s; wrote {out} "
            f"and {out}.summary.json" + (f"; {len(errors)} users with errors" if errors else ""))
        return summary
    finally:
        if ranks.distributed:
            import torch.distributed as dist

            dist.destroy_process_group()


def _write(out: Path, catalog, users: Users, rows: np.ndarray, scores: np.ndarray, errors: dict,
           version: int) -> dict:
    ids = catalog.ids_of_rows(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for i, label in enumerate(users.labels):
            if i in errors:
                rec = dict(user=label, error=errors[i])
            else:
                keep = rows[i] >= 0
                rec = dict(user=label, items=[x.item() if hasattr(x, "item") else x for x in ids[i][keep]],
                           scores=[float(s) for s in scores[i][keep]], catalog_version=version)
            f.write(json.dumps(rec) + "\n")
    return dict(users=len(users), errors=len(errors), out=str(out))
