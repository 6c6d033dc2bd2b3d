"""Training split over several calls (--state, --resume, --stop-after-minutes) and --amp."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from zerogr_core.cli import main
from zerogr_core.errors import ZeroGRError

from test_recsys_beauty import write_sequences

pytest.importorskip("transformers")

TIMING = ("seconds", "elapsed_s")


def untimed(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in TIMING} for record in history]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture
def seq(tmp_path):
    write_sequences(tmp_path / "seq.txt", n_users=30, n_items=20, seed=1)
    return tmp_path / "seq.txt"


@pytest.mark.reference_kernels
def test_two_calls_give_the_one_call_checkpoint(tmp_path, seq, capsys):
    one = tmp_path / "one.pt"
    assert main(["train", "--data", str(seq), "--preset", "tiny", "--out", str(one)]) == 0
    assert not (tmp_path / "one.pt.state.pt").exists()       # no flags: no state, as before
    split = tmp_path / "split.pt"
    capsys.readouterr()
    # A limit shorter than any epoch stops after the first one (every call trains at least one).
    args = ["train", "--data", str(seq), "--preset", "tiny", "--out", str(split), "--stop-after-minutes", "1e-6"]
    assert main(args) == 0
    out = capsys.readouterr().out
    state = tmp_path / "split.pt.state.pt"
    assert not split.exists() and state.is_file()
    line = out.strip().splitlines()[-1]
    assert line.startswith("stopped after ") and "(epoch 1 of 2," in line
    assert line.endswith(f"resume with: python -m zerogr_core train --data {seq} --preset tiny --out {split} "
                         f"--device auto --stop-after-minutes 1e-06 --state {state} --resume")
    assert main(args + ["--resume"]) == 0
    assert "finished: epochs after epoch 2 of 2" in capsys.readouterr().out
    a, b = torch.load(one, weights_only=True), torch.load(split, weights_only=True)
    assert_same_weights(a["state_dict"], b["state_dict"])
    assert untimed(a["history"]) == untimed(b["history"]) and len(b["history"]) == 2
    assert a["selection"] == b["selection"]
    assert b["amp"] is None and b["optimizer"] == {"name": "AdamW", "fused": False}
    # Resuming a finished run writes its checkpoint again without training.
    split.unlink()
    assert main(args + ["--resume"]) == 0
    assert_same_weights(a["state_dict"], torch.load(split, weights_only=True)["state_dict"])


@pytest.mark.reference_kernels
def test_many_calls_follow_the_schedule_of_one_with_dropout_and_the_validity_term(tmp_path, seq):
    """Every RNG the loop uses (shuffles, dropout, the validity term's draws) resumes where it stopped."""
    from zerogr_core.recsys.data import leave_one_out
    from zerogr_core.recsys.semantic_ids import SIDConfig
    from zerogr_core.recsys.seqrec_config import SeqPreset
    from zerogr_core.recsys.seqrec_train import RunControl, train_t5
    from zerogr_core.recsys.sequences import load_sequences, sequence_semantic_ids

    base = SeqPreset.preset("tiny")
    preset = replace(base, model=replace(base.model, dropout=0.1),
                     train=replace(base.train, epochs=5, eval_every=2, patience=10, validity_weight=0.5))
    data = load_sequences(seq)
    split = leave_one_out(data)
    sid = sequence_semantic_ids(data, split, SIDConfig.preset("tiny"))
    run = dict(preset=preset, split=split, catalog=sid.catalog, row_of_item=sid.row_of_item,
               device=torch.device("cpu"), log=lambda line: None)
    model, history, best = train_t5(**run)
    identity = dict(study="tiny-dropout")
    state = tmp_path / "s.pt"
    calls = 0
    while True:
        calls += 1
        control = RunControl(state=state, resume=calls > 1, stop_after_s=1e-9, identity=identity)
        resumed, history2, best2 = train_t5(**run, control=control)
        if best2["stopped"] != "stop_after":
            break
        assert best2["epochs_done"] == calls
    assert calls == 5 and best2 == best and best["stopped"] == "epochs"
    assert untimed(history2) == untimed(history)
    assert_same_weights(model.state_dict(), resumed.state_dict())
    # Step-based schedule: the learning rate of every epoch's last step matches too (already in
    # the history); the training seconds accumulate over the calls.
    assert history2[-1]["elapsed_s"] >= sum(r["seconds"] for r in history2)


@pytest.mark.reference_kernels
def test_resume_refuses_a_state_of_another_run(tmp_path, seq, capsys):
    out = tmp_path / "m.pt"
    args = ["train", "--data", str(seq), "--preset", "tiny", "--out", str(out), "--stop-after-minutes", "1e-6"]
    assert main(args) == 0
    state = f"{out}.state.pt"
    capsys.readouterr()
    assert main(args + ["--resume", "--seed", "3"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (f"error: {state}: training state of another run (study.train.seed is 0 there, 3 here); "
                           f"drop --resume to start afresh")
    assert main(args + ["--resume", "--validity-weight", "0.5"]) == 1
    assert "(study.train.validity_weight is 0.0 there, 0.5 here)" in capsys.readouterr().err
    assert main(args + ["--resume", "--max-minutes", "5"]) == 1
    assert "(study.train.max_minutes is None there, 5.0 here)" in capsys.readouterr().err
    write_sequences(tmp_path / "other.txt", n_users=30, n_items=20, seed=2)
    other = ["train", "--data", str(tmp_path / "other.txt"), "--preset", "tiny", "--out", str(out), "--resume"]
    assert main(other) == 1
    err = capsys.readouterr().err
    assert "training state of another run (data is" in err and err.count("\n") == 1


def test_missing_or_corrupt_state_is_one_line(tmp_path, seq, capsys):
    out = tmp_path / "m.pt"
    base = ["train", "--data", str(seq), "--preset", "tiny", "--out", str(out)]
    assert main(base + ["--resume"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {out}.state.pt: training state not found (--resume needs the state of an earlier call)\n"
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x80\x02not a torch file" * 10)
    assert main(base + ["--resume", "--state", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not a readable training state (") and err.count("\n") == 1
    assert "Traceback" not in err
    torch.save({"format": "zerogr-seqrec-1"}, bad)          # a checkpoint is not a state
    assert main(base + ["--resume", "--state", str(bad)]) == 1
    assert capsys.readouterr().err == f"error: {bad}: not a zerogr-seqrec-state-1 training state\n"
    assert main(base + ["--stop-after-minutes", "0"]) == 2  # refused as the command line is parsed
    assert capsys.readouterr().err == ("error: argument --stop-after-minutes: must be a positive number of minutes, "
                                       "got 0\n")


def test_amp_is_refused_on_the_cpu(tmp_path, seq, capsys):
    assert main(["train", "--data", str(seq), "--preset", "tiny", "--device", "cpu", "--amp", "bf16",
                 "--out", str(tmp_path / "m.pt")]) == 1
    assert capsys.readouterr().err == ("error: --amp bf16 needs a CUDA device (training runs on cpu); "
                                       "drop --amp on the CPU\n")
    assert not (tmp_path / "m.pt").exists()
    from zerogr_core.recsys.seqrec_train import check_amp
    with pytest.raises(ZeroGRError, match="--amp: 'fp16' is not supported"):
        check_amp("fp16", torch.device("cuda"))


def test_cuda_graph_is_refused_on_the_cpu_before_any_work(tmp_path, seq, capsys):
    assert main(["train", "--data", str(seq), "--preset", "tiny", "--device", "cpu", "--cuda-graph",
                 "--out", str(tmp_path / "m.pt")]) == 1
    assert capsys.readouterr() == ("", "error: --cuda-graph: CUDA graphs need --device cuda, got cpu\n")
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.reference_kernels
def test_gpu_recipe_script_resumes_across_calls_and_returns_parts(tmp_path, seq):
    """runs/train_beauty_gpu.sh in its CPU dry run: refuses to start without FRESH=1, stops after an epoch,
    resumes, runs quality once training has ended, and its parts re-join on a fresh state folder."""
    import hashlib
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "runs" / "train_beauty_gpu.sh"

    def call(out: str, state: str = "state", **env) -> subprocess.CompletedProcess:
        full = dict(os.environ, DRY_RUN="1", DRY_DATA=str(seq), PYTHON=sys.executable, OUT=str(tmp_path / out),
                    STATE_DIR=str(tmp_path / state), CALL_MINUTES="1e-6", PART_SIZE="20K", **env)
        return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=300)

    first = call("o0")
    assert first.returncode == 3 and "FRESH=1 starts the schedule afresh" in first.stdout
    one = call("o1", FRESH="1")
    assert one.returncode == 0, one.stdout + one.stderr
    assert "stopped after" in one.stdout and sorted(os.listdir(tmp_path / "o1")) == ["train.log"]
    two = call("o2")
    assert two.returncode == 0, two.stdout + two.stderr
    assert "finished: epochs after epoch 2 of 2" in two.stdout and "quality written" in two.stdout
    files = sorted(os.listdir(tmp_path / "o2"))
    parts = [f for f in files if f.startswith("model.pt.part-")]
    assert len(parts) >= 2 and {"SHA256SUMS", "train.log", "quality-seq-tiny.json"} <= set(files)
    joined = b"".join((tmp_path / "o2" / p).read_bytes() for p in parts)
    model = (tmp_path / "state" / "model.pt").read_bytes()
    assert joined == model
    assert (tmp_path / "o2" / "SHA256SUMS").read_text() == f"{hashlib.sha256(model).hexdigest()}  model.pt\n"
    log = (tmp_path / "o2" / "train.log").read_text()
    assert "stopped after" in log and "finished:" in log            # the log of both calls
    # A fresh machine: the parts re-join, quality runs again, no training.
    three = call("o3", state="fresh", PARTS_DIR=str(tmp_path / "o2"))
    assert three.returncode == 0 and "joined" in three.stdout and "python -m zerogr_core train" not in three.stdout
    assert (tmp_path / "fresh" / "model.pt").read_bytes() == model
    # Mixed-up parts are caught by the checksum.
    (tmp_path / "o2" / parts[0]).write_bytes(b"x")
    bad = call("o4", state="bad", PARTS_DIR=str(tmp_path / "o2"))
    assert bad.returncode == 4 and "differs from SHA256SUMS" in bad.stdout


def test_inverse_sqrt_schedule_and_the_tiger_paper_preset():
    """The TIGER paper's schedule: constant for the warm-up steps, then lr · sqrt(warmup / step)."""
    import argparse

    import math

    from zerogr_core.recsys.commands import register
    from zerogr_core.recsys.seqrec_config import PRESETS, SeqPreset, SeqTrainConfig
    from zerogr_core.recsys.seqrec_train import learning_rate

    paper = SeqPreset.preset("tiger-paper")
    assert paper.model == SeqPreset.preset("tiger").model
    t = paper.train
    assert (t.batch_size, t.lr, t.schedule, t.warmup_steps) == (256, 1e-2, "inverse-sqrt", 10_000)
    assert t.epochs * -(-131_413 // t.batch_size) >= 200_000          # TIGER's 200k steps on Beauty
    with pytest.raises(ZeroGRError, match="schedule: 'linear' is not one of cosine, inverse-sqrt"):
        SeqTrainConfig(schedule="linear")
    with pytest.raises(ZeroGRError, match="choose from tiger, tiger-paper, cpu, tiny"):
        SeqPreset.preset("nope")
    for step, want in ((0, 1e-2), (9_999, 1e-2), (39_999, 5e-3), (199_999, 1e-2 * math.sqrt(0.05))):
        # a budget only stops this schedule, it does not anneal it
        assert learning_rate(t, step, 200_000, 1e9, 60.0) == pytest.approx(want, rel=1e-12)
    cosine = SeqPreset.preset("tiger").train
    quarter = cosine.lr * 0.5 * (1 + math.cos(math.pi / 4))
    assert learning_rate(cosine, 750, 3000, 0.0, math.inf) == pytest.approx(quarter)
    assert learning_rate(cosine, 0, 1000, 30.0, 60.0) == pytest.approx(cosine.lr / cosine.warmup_steps * 0.5)
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="command")
    register(subparsers)
    train = subparsers.choices["train"]
    assert tuple(next(a for a in train._actions if a.dest == "preset").choices) == PRESETS
