"""decode-dataset: two ranks under torchrun (gloo, CPU) write exactly what one process writes."""
import json
import os
import subprocess
import sys

import pytest

from zerogr_core.recsys import movielens

pytestmark = pytest.mark.skipif(not movielens.available(), reason="the bundled MovieLens model is not there")

ARGS = ["decode-dataset", "--users", "16", "--beam", "8", "--k", "5", "--batch-sizes", "4", "--engine", "reference"]


def run(cmd, tmp_path):
    # reference ops (the interpreter would take minutes); one thread per rank
    env = dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_two_gloo_ranks_gather_what_one_process_decodes(tmp_path):
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    run([sys.executable, "-m", "zerogr_core", *ARGS, "--out", str(one)], tmp_path)
    log = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517",
               "-m", "zerogr_core", *ARGS, "--out", str(two)], tmp_path)
    assert "on 2 rank(s) (gloo, cpu)" in log.stdout
    a = [json.loads(line) for line in one.read_text().splitlines()]
    b = [json.loads(line) for line in two.read_text().splitlines()]
    assert len(a) == 16 and a == b
    assert all(len(r["items"]) == 5 and r["catalog_version"] == 1 for r in a)
    summary = json.loads((tmp_path / "two.jsonl.summary.json").read_text())
    assert summary["world_size"] == 2 and summary["backend"] == "gloo" and len(summary["rank_decode_s"]) == 2
    assert summary["users"] == 16 and summary["errors"] == 0


def test_per_user_allow_and_exclude_lists_are_obeyed(tmp_path):
    from zerogr_core.catalog.samples import open_catalog

    ids = [int(i) for i in open_catalog("movielens").item_ids]
    history = ids[10:13]
    allowed = ids[200:260]
    users = tmp_path / "users.jsonl"
    users.write_text("\n".join(json.dumps(u) for u in (
        {"user": "free", "history": history},
        {"user": "allowed", "history": history, "allow": allowed},
        {"user": "both", "history": history, "allow": allowed, "exclude": allowed[:30]},
        {"user": "bad", "history": history, "allow": [10**12]})) + "\n")
    out = tmp_path / "o.jsonl"
    run([sys.executable, "-m", "zerogr_core", "decode-dataset", "--input", str(users), "--beam", "8", "--k", "5",
         "--batch-sizes", "4", "--engine", "reference", "--out", str(out)], tmp_path)
    got = {r["user"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(got["free"]["items"]) == 5 and not set(got["free"]["items"]) <= set(allowed)
    assert len(got["allowed"]["items"]) == 5 and set(got["allowed"]["items"]) <= set(allowed)
    assert len(got["both"]["items"]) == 5 and set(got["both"]["items"]) <= set(allowed[30:])
    assert "allow" in got["bad"]["error"]
