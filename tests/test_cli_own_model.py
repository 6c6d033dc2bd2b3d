"""``compare-orders``: both orders on the user's own model (a transformers checkpoint folder or a
project checkpoint), in-process, and its one-line usage errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from zerogr_core.bench.order_latency import CPU_LOOP
from zerogr_core.catalog.io import load_catalog
from zerogr_core.cli import main

transformers = pytest.importorskip("transformers")

VOCAB, OFFSETS = 14, [2, 6, 10]   # ids 0-1: pad, eos; then 3 SID levels of 4 tokens
CATALOG_ROWS = ["item_id,s1,s2,s3"] + [f"{100 + i},{a},{b},{c}" for i, (a, b, c) in enumerate(
    [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 2, 3), (1, 0, 2), (1, 3, 3), (2, 1, 1), (2, 2, 0), (3, 0, 1), (3, 3, 2)])]


def tiny_model(kind: str):
    torch.manual_seed(0)
    if kind == "t5":
        config = transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                       num_decoder_layers=1, num_heads=2, decoder_start_token_id=0, pad_token_id=0,
                                       eos_token_id=1, dropout_rate=0.0)
        return transformers.T5ForConditionalGeneration(config)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32,
                                     bos_token_id=2, eos_token_id=1, pad_token_id=0)
    return transformers.GPT2LMHeadModel(config)


@pytest.fixture
def files(tmp_path):
    """A catalog CSV and one saved checkpoint folder per kind, offsets in zerogr.json."""
    catalog = tmp_path / "items.csv"
    catalog.write_text("\n".join(CATALOG_ROWS) + "\n")
    for kind in ("t5", "gpt2"):
        tiny_model(kind).save_pretrained(tmp_path / kind)
        (tmp_path / kind / "zerogr.json").write_text(json.dumps({"token_offsets": OFFSETS}))
    return tmp_path


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(capsys, *args: str) -> str:
    code, _, err = run_main(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.reference_kernels
@pytest.mark.parametrize("kind", ["t5", "gpt2"])
def test_both_orders_return_catalog_items_as_json(files, capsys, kind):
    code, out, err = run_main(capsys, "compare-orders", "--catalog", files / "items.csv", "--model", files / kind,
                              "--batch", "2", "--beam", "4", "--repeats", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert set(report) == {"catalog", "model", "device", "batch", "beam", "seed", "repeats", "orders", "also_timed",
                           "notes", "k", "overlap_at_k", "share_differ_at_k", "all_in_catalog"}
    assert report["also_timed"] == {}  # the valid-token STATIC graph is a GPU's
    assert report["model"]["token_offsets"] == OFFSETS and report["model"]["kind"] == "transformers"
    assert report["catalog"]["items"] == 10 and report["k"] == 4
    assert set(report["orders"]) == {"filter-first", "score-first"}
    for order in report["orders"].values():
        # like for like: on a CPU both orders run the reference loop (on a GPU: graph against graph)
        assert order["implementation"] == CPU_LOOP
        assert order["runs"] == 2 and order["p10_ms"] <= order["median_ms"] <= order["p90_ms"]
        assert order["returned"] == order["in_catalog"] == 2 * 4 and order["all_in_catalog"]
    assert report["all_in_catalog"] and 0.0 <= report["overlap_at_k"] <= 1.0


@pytest.mark.reference_kernels
def test_text_report_and_offsets_on_the_command_line(files, capsys):
    """--offsets overrides zerogr.json; the text report names both orders and the checks."""
    (files / "t5" / "zerogr.json").unlink()
    code, out, err = run_main(capsys, "compare-orders", "--catalog", files / "items.csv", "--model", files / "t5",
                              "--offsets", "2,6,10", "--batch", "1", "--beam", "3", "--repeats", "2")
    assert code == 0, err
    assert "filter-first" in out and "score-first" in out and "overlap@3:" in out
    assert out.count(CPU_LOOP) == 2  # what each order ran
    assert "every returned item is in the catalog: yes" in out and "token offsets 2/6/10" in out


@pytest.mark.reference_kernels
def test_a_project_checkpoint_decodes_over_its_own_catalog(capsys):
    from zerogr_core.recsys.train import BUNDLED_CHECKPOINT

    if not BUNDLED_CHECKPOINT.is_file():
        pytest.skip("no bundled MovieLens checkpoint")
    code, out, err = run_main(capsys, "compare-orders", "--checkpoint", BUNDLED_CHECKPOINT, "--batch", "1",
                              "--beam", "4", "--repeats", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["model"]["kind"] == "project" and report["all_in_catalog"]
    assert report["catalog"]["items"] == load_catalog(BUNDLED_CHECKPOINT.parent / "sid_catalog.csv").n_items
    # another catalog than the one it was trained with is refused
    line = one_line_error(capsys, "compare-orders", "--checkpoint", BUNDLED_CHECKPOINT, "--catalog", "tiny")
    assert line.startswith("error: --catalog:")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_both_orders_run_as_cuda_graphs(capsys):
    """Like for like on a GPU: filtering first as the engine's graph, scoring first as the
    suite's graphed STATIC-style baseline, and the suite's valid-token STATIC beside them, as the
    Decode page times them."""
    from zerogr_core.bench.order_latency import GPU_GRAPH, STATIC_GRAPH, VALID_STATIC_GRAPH, VALID_TOKENS
    from zerogr_core.recsys.train import BUNDLED_CHECKPOINT

    if not BUNDLED_CHECKPOINT.is_file():
        pytest.skip("no bundled MovieLens checkpoint")
    code, out, err = run_main(capsys, "compare-orders", "--checkpoint", BUNDLED_CHECKPOINT, "--batch", "4",
                              "--beam", "16", "--repeats", "5", "--device", "cuda", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["orders"]["filter-first"]["implementation"] == GPU_GRAPH, report
    assert report["orders"]["score-first"]["implementation"] == STATIC_GRAPH, report
    # and the valid-token STATIC beside them (filtering first's beams, scoring first's order)
    valid = report["also_timed"][VALID_TOKENS]
    assert valid["implementation"] == VALID_STATIC_GRAPH and valid["runs"] >= 5, report
    assert valid["p10_ms"] <= valid["median_ms"] <= valid["p90_ms"]
    assert report["all_in_catalog"] and not report["notes"]


@pytest.mark.parametrize("text", ["\u00b2,6,10", "--2,6,10"])
def test_offsets_int_misread_are_one_line_errors(files, capsys, text):
    # '²' and '--2' pass str.isdigit() after lstrip('-') but fail int(): the error's own search found no bad
    # entry and ended in a StopIteration traceback
    base = ("compare-orders", "--catalog", files / "items.csv", "--model", files / "t5")
    assert one_line_error(capsys, *base, f"--offsets={text}") == \
        f"error: --offsets: {text.split(',')[0]!r} is not a whole number"


@pytest.mark.parametrize("entry, shown", [("Infinity", "'inf'"), ("2.7", "'2.7'"), ("true", "'True'")])
def test_offsets_file_entries_are_whole_numbers(files, capsys, entry, shown):
    # int() raised OverflowError (a traceback) on JSON's Infinity, and read 2.7 as 2 and true as 1
    (files / "t5" / "zerogr.json").write_text(f'{{"token_offsets": [{entry}, 6, 10]}}')
    line = one_line_error(capsys, "compare-orders", "--catalog", files / "items.csv", "--model", files / "t5")
    assert line.startswith("error: --model: ") and line.endswith(f"zerogr.json: token_offsets: {shown} is not a "
                                                                 f"whole number")


def test_bad_inputs_are_one_line_usage_errors_naming_the_argument(files, capsys, tmp_path, monkeypatch):
    base = ("compare-orders", "--catalog", files / "items.csv")
    assert one_line_error(capsys, *base, "--model", tmp_path / "nowhere").startswith(
        "error: --model: no transformers checkpoint")
    assert one_line_error(capsys, *base, "--model", files / "t5", "--offsets", "2,six,10") == \
        "error: --offsets: 'six' is not a whole number"
    # 3 levels of 4 tokens from id 12 run past a vocabulary of 14
    line = one_line_error(capsys, *base, "--model", files / "t5", "--offsets", "2,6,12")
    assert line.startswith("error: --offsets:") and "vocabulary has 14 ids" in line
    assert one_line_error(capsys, *base, "--model", files / "t5", "--offsets", "2,6").startswith(
        "error: --offsets: 2 offsets for a catalog of 3 levels")
    (files / "gpt2" / "zerogr.json").write_text(json.dumps({"token_offsets": [2, 6, 11]}))
    assert one_line_error(capsys, *base, "--model", files / "gpt2").startswith(
        "error: --offsets (from zerogr.json): level 3 needs vocabulary ids [11, 15)")
    (files / "gpt2" / "zerogr.json").write_text('{"offsets": 3}')
    assert one_line_error(capsys, *base, "--model", files / "gpt2").startswith("error: --model:")
    (files / "gpt2" / "zerogr.json").unlink()
    assert one_line_error(capsys, *base, "--model", files / "gpt2").startswith("error: --offsets:")
    assert one_line_error(capsys, "compare-orders", "--model", files / "t5").startswith("error: --catalog:")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in (files / "t5").iterdir():
        (broken / f.name).write_bytes(f.read_bytes()[:8] if f.suffix == ".safetensors" else f.read_bytes())
    assert one_line_error(capsys, *base, "--model", broken).startswith("error: --model: transformers cannot load it")
    assert one_line_error(capsys, "compare-orders", "--catalog", tmp_path / "none.csv", "--model",
                          files / "t5").startswith("error: --catalog:")
    assert one_line_error(capsys, *base, "--model", files / "t5", "--beam", "0") == \
        "error: argument --beam: must be ≥ 1, got 0"
    # a bad checkpoint is a file that fails to read, as in every command that takes one (test_cli): status 1
    code, _, err = run_main(capsys, *base, "--checkpoint", files / "items.csv")
    assert code == 1 and err.startswith(f"error: --checkpoint {files / 'items.csv'}: not a readable checkpoint (")
    assert err.count("\n") == 1, err
    # bounded work: the beams one comparison decodes, and its timed repeats
    assert one_line_error(capsys, *base, "--model", files / "t5", "--batch", "1024", "--beam", "128").startswith(
        "error: --batch × --beam: 1024 × 128 beams is over the 65,536")
    assert one_line_error(capsys, *base, "--model", files / "t5", "--repeats", "5000") == \
        "error: argument --repeats: must be in 2…1000, got 5000"
    # and the app's limit on the logits of one decode (here lowered through its variable)
    monkeypatch.setenv("ZEROGR_MAX_DECODE_LOGITS", "100")
    assert one_line_error(capsys, *base, "--model", files / "t5", "--batch", "4", "--beam", "16").startswith(
        "error: --batch × --beam: batch 4 × beam 16 × 12 tokens over all levels is 768 logits per decode, over "
        "this machine's limit of 100")


def test_the_text_report_lists_a_series_timed_besides_the_orders():
    """A GPU's valid-token STATIC is a row of the table and names what ran; the orders' rows keep their layout."""
    from zerogr_core.bench.compare_orders import format_report
    from zerogr_core.bench.order_latency import VALID_STATIC_GRAPH, VALID_TOKENS

    timing = dict(median_ms=2.0, p10_ms=1.5, p90_ms=2.5, runs=5)
    orders = {o: dict(timing, implementation=o.upper(), returned=8, in_catalog=8, all_in_catalog=True)
              for o in ("filter-first", "score-first")}
    report = dict(catalog=dict(name="c", items=10, levels=3, codebook_sizes=[4, 4, 4]),
                  model=dict(architecture="M", path="p", token_offsets=None), batch=2, beam=4, device="cuda",
                  repeats=5, orders=orders, notes=[], k=4, overlap_at_k=1.0, share_differ_at_k=0.0,
                  all_in_catalog=True)
    plain = format_report(dict(report, also_timed={})).splitlines()
    assert plain[3] == "filter-first       2.000      1.500      2.500       8 of 8"
    lines = format_report(dict(report, also_timed={VALID_TOKENS: dict(timing, implementation=VALID_STATIC_GRAPH)}))
    lines = lines.splitlines()
    w = len(VALID_TOKENS)
    assert lines[2].startswith(f"{'order':>{w}}   median ms")
    assert lines[5] == f"{VALID_TOKENS}       2.000      1.500      2.500"  # timed only: no catalog check
    assert lines[3] == f"{'filter-first':>{w}}       2.000      1.500      2.500       8 of 8"
    assert f"{VALID_TOKENS}: {VALID_STATIC_GRAPH}" in lines


def test_the_catalog_check_counts_beams_whose_sid_is_not_an_item():
    """A beam whose tokens are not its row's SID is counted out of the catalog."""
    from zerogr_core.bench.compare_orders import _in_catalog
    from zerogr_core.decode.search import DecodeResult

    catalog = load_catalog_rows()
    tokens = torch.tensor([[[0, 0, 0], [0, 0, 1], [-1, -1, -1]]])
    result = DecodeResult(tokens, torch.tensor([[-1.0, -2.0, float("-inf")]]), torch.tensor([[0, 0, -1]]))
    assert _in_catalog(catalog, result) == dict(returned=2, in_catalog=1, all_in_catalog=False)


def load_catalog_rows():
    from zerogr_core import Catalog

    sids = np.array([[int(v) for v in row.split(",")[1:]] for row in CATALOG_ROWS[1:]])
    return Catalog.from_sids(sids, (4, 4, 4))
