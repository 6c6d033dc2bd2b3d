"""Every numeric argument of every command is checked when the command line is parsed
(``zerogr_core.arg_types``): one line naming the flag, before any work, and typed defaults."""
from __future__ import annotations

import pytest

from zerogr_core.arg_types import SEED_MAX
from zerogr_core.cli import build_parser, main


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


#: (command line without the argument, argument, smallest value accepted, largest or None): every
#: count of every command, checked by zerogr_core.arg_types when the command line is parsed. Every
#: --seed is at most SEED_MAX (2**32 - 1): the trainings seed numpy's legacy generator, which takes no
#: more, and plan, warmup, bench and bench-e2e failed with torch's 'Overflow when unpacking long long'
#: past 2**64 - 1 (plan and warmup at 2**64 - 1 itself, seeding with seed + 1; bench from about 2**47,
#: mixing the seed into its generators' seeds).
COUNT_ARGUMENTS = [
    *[(["synth", "watch-like", "--n", "10", "--out", "x.csv"], flag, least, most)
      for flag, least, most in (("--n", 1, None), ("--seed", 0, SEED_MAX), ("--codebook", 1, None))],
    (["index", "tiny"], "--dense-steps", 1, None),
    (["next", "tiny"], "--prefix", 0, None),
    (["stats", "tiny"], "--codebook-sizes", 1, None),
    *[(["plan", "tiny"], flag, least, most) for flag, least, most in (("--batch", 1, None), ("--beam", 1, None),
                                                                      ("--hidden", 1, 65_536),
                                                                      ("--seed", 0, SEED_MAX))],
    *[(["warmup", "tiny"], flag, least, most) for flag, least, most in (("--batch", 1, None), ("--beam", 1, None),
                                                                        ("--hidden", 1, 65_536),
                                                                        ("--seed", 0, SEED_MAX))],
    *[(["bench", "--quick"], flag, least, most)
      for flag, least, most in (("--batch", 1, None), ("--beam", 1, None), ("--hidden", 1, 65_536),
                                ("--codebook", 1, None), ("--scale", 1, None), ("--seed", 0, SEED_MAX),
                                ("--repeats", 1, 10_000), ("--warmup", 0, 10_000), ("--build-repeats", 1, None))],
    *[(["bench-e2e", "--quick"], flag, least, most)
      for flag, least, most in (("--batch", 1, None), ("--beam", 1, None), ("--items", 1, None),
                                ("--repeats", 1, 10_000), ("--hf-repeats", 1, 10_000), ("--warmup", 0, 10_000),
                                ("--seed", 0, SEED_MAX))],
    *[(["compare-orders", "--checkpoint", "m.pt"], flag, least, most)
      for flag, least, most in (("--batch", 1, None), ("--beam", 1, None), ("--k", 1, None), ("--repeats", 2, 1000),
                                ("--seed", 0, SEED_MAX))],
    *[(["train", "--out", "m.pt"], flag, least, most)
      for flag, least, most in (("--seed", 0, SEED_MAX), ("--patience", 1, None))],
    *[(["quality"], flag, 1, None) for flag in ("--beam", "--users", "--batch-size")],
    *[(["coldstart"], flag, least, most) for flag, least, most in (("--seed", 0, SEED_MAX), ("--users", 1, None))],
    *[(["serve"], flag, least, most) for flag, least, most in (("--replicas", 1, None), ("--port", 1, 65535),
                                                               ("--beam", 1, None), ("--batch-sizes", 1, None))],
    (["serve", "--llm", "tiny"], "--token-offsets", 0, None),
    *[(["decode-dataset", "--out", "x.jsonl"], flag, 1, None) for flag in ("--users", "--k", "--beam",
                                                                           "--batch-sizes")],
]


def _bad_values(least: int, most: int | None):
    """Values out of range (with the message's tail) and values that are no integer at all."""
    low = [v for v in (least - 1, -1, 0) if v < least]
    span = f"in {least}…{most}" if most is not None else f"≥ {least}"
    yield from ((str(v), f"must be {span}, got {v}") for v in dict.fromkeys(low))
    if most is not None:
        yield str(most + 1), f"must be {span}, got {most + 1}"
    yield from ((text, f"{text!r} is not a whole number") for text in ("x", "1.5"))


@pytest.mark.parametrize("base, flag, value, message", [
    pytest.param(base, flag, value, message, id=f"{base[0]} {flag} {value}")
    for base, flag, least, most in COUNT_ARGUMENTS for value, message in _bad_values(least, most)])
def test_every_count_argument_is_checked_on_parsing(capsys, base, flag, value, message):
    # the same mistake reads the same in every command: one line naming the argument, status 2
    code, out, err = run_main(capsys, *base, flag, value)
    assert (code, out, err) == (2, "", f"error: argument {flag}: {message}\n")


def test_count_arguments_have_typed_defaults():
    parser = build_parser()
    plan = parser.parse_args(["plan", "tiny"])
    assert (plan.batch, plan.beam, plan.hidden, plan.seed) == (8, 128, 1024, 0)
    warmup = parser.parse_args(["warmup", "tiny", "--batch", "1 4,2e1", "--hidden", "1_024"])
    assert (warmup.batch, warmup.beam, warmup.hidden) == ([1, 4, 20], [128], [1024])
    compare = parser.parse_args(["compare-orders", "--checkpoint", "m.pt"])
    assert (compare.batch, compare.beam, compare.k, compare.repeats, compare.seed, compare.device) == \
        (4, 16, 10, 10, 0, "cpu")
    serve = parser.parse_args(["serve", "--batch-sizes", "1,8"])
    assert (serve.port, serve.batch_sizes, serve.replicas) == (8000, [1, 8], None)
    assert parser.parse_args(["index", "tiny"]).dense_steps == []
    assert parser.parse_args(["next", "tiny", "--prefix", ""]).prefix == []
    assert parser.parse_args(["synth", "watch-like", "--n", "2e7", "--out", "x.csv"]).n == 20_000_000


def test_arg_types_parse_and_bound_integers():
    import argparse

    from zerogr_core.arg_types import number, seconds, to_int, whole, wholes
    from zerogr_core.errors import Parser, UsageError

    assert [to_int(t) for t in ("12", "-3", "+4", " 7 ", "1_000", "2e3", "4.0", "1.5e1")] == \
        [12, -3, 4, 7, 1000, 2000, 4, 15]
    for text, message in (("1.5", "'1.5' is not an integer"), ("x", "'x' is not an integer"),
                          ("", "'' is not an integer"), ("nan", "'nan' is not an integer"),
                          ("inf", "'inf' is not an integer"), ("0x10", "'0x10' is not an integer"),
                          ("1e40", "'1e40' is too large")):
        with pytest.raises(ValueError, match=f"^{message}$"):
            to_int(text)
    with pytest.raises(ValueError, match="^'x' is not a whole number$"):
        to_int("x", least=0)
    with pytest.raises(ValueError, match="^must be ≥ 1, got 0$"):
        to_int("0", least=1)
    with pytest.raises(ValueError, match="^must be ≤ 9, got 10$"):
        to_int("10", most=9)
    with pytest.raises(ValueError, match="^must be in 1…9, got 10$"):
        to_int("10", 1, 9)
    assert whole(0)("0") == 0 and whole(None)("-5") == -5 and whole(1, 3)("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="^must be ≥ 1, got -1$"):
        whole()("-1")
    assert wholes()("1,8 32") == [1, 8, 32] and wholes(0, empty=True)(" ") == []
    with pytest.raises(argparse.ArgumentTypeError, match="^give at least one value$"):
        wholes()(",")
    with pytest.raises(argparse.ArgumentTypeError, match="^must be ≥ 1, got 0$"):
        wholes()("4,0")
    assert seconds()("1.5") == 1.5
    for text, message in (("x", "'x' is not a number of seconds"), ("0", "must be a positive number of seconds"),
                          ("nan", "must be a positive number of seconds")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            seconds()(text)
    assert number()("-2.5") == -2.5 and number(0, 1)("1") == 1.0 and number(positive=True)("1e-9") == 1e-9
    for parse, text, message in ((number(), "x", "^'x' is not a number$"),
                                 (number(), "inf", "^must be a finite number, got inf$"),
                                 (number(0), "-0.5", "^must be ≥ 0, got -0.5$"),
                                 (number(0, 10_000.0, unit="milliseconds"), "nan",
                                  "^must be in 0…10000 milliseconds, got nan$"),
                                 (number(positive=True, unit="minutes"), "0", "^must be a positive number of minutes")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)
    parser = Parser(prog="p")
    parser.add_argument("--n", type=whole(1))
    with pytest.raises(UsageError, match="^argument --n: must be ≥ 1, got 0$"):
        parser.parse_args(["--n", "0"])


@pytest.mark.parametrize("module, argv, message", [
    ("zerogr_core.bench.llm", ["--repeats", "0"], "argument --repeats: must be ≥ 1, got 0"),
    ("zerogr_core.bench.llm", ["--agreement-requests", "-1"], "argument --agreement-requests: must be ≥ 0, got -1"),
    ("zerogr_core.bench.llm", ["--budget-s", "-5"],
     "argument --budget-s: must be a positive number of seconds, got -5"),
    ("zerogr_core.bench.llm", ["--shapes", "1000x0"],
     "argument --shapes: expected CONTEXTxBATCH[,…] with positive integers, got '1000x0'"),
    ("zerogr_core.serve.llm_load_test", ["--requests", "x"], "argument --requests: 'x' is not a whole number"),
    ("zerogr_core.serve.llm_load_test", ["--concurrency", "0"], "argument --concurrency: must be ≥ 1, got 0"),
    ("zerogr_core.serve.llm_load_test", ["--context", "1.5"], "argument --context: '1.5' is not a whole number"),
    ("zerogr_core.serve.load_test", ["--clients", "0"], "argument --clients: must be ≥ 1, got 0"),
    ("zerogr_core.serve.load_test", ["--seconds", "nan"],
     "argument --seconds: must be a positive number of seconds, got nan"),
    ("zerogr_core.serve.load_test", ["--replicas", "1,x"], "argument --replicas: 'x' is not a whole number"),
])
def test_standalone_benchmarks_check_counts_on_parsing(capsys, tmp_path, module, argv, message):
    import importlib

    code = importlib.import_module(module).main(["--out", str(tmp_path), *argv])
    assert (code, *capsys.readouterr()) == (2, "", f"error: {message}\n")
    assert not any(tmp_path.iterdir())
