"""How the HF adapter reads a model's hidden states, on a model it shares with other threads."""
import threading

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_hf import MODELS, OFFSETS, gated_t5_model, inputs, tiny_catalog  # noqa: E402
from zerogr_core import build_index  # noqa: E402
from zerogr_core.errors import ZeroGRError  # noqa: E402
from zerogr_core.hf import HFStepModel, generate  # noqa: E402
from zerogr_core.models.hf import hidden_outputs  # noqa: E402

WAIT_S = 60


@torch.no_grad()
def forward(model):
    """``model(...).logits`` of the test requests (two decoder positions for an encoder–decoder)."""
    ids, mask = inputs()
    if model.config.is_encoder_decoder:
        dec = torch.tensor([[0, 5], [0, 9]])
        return model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    pos = (mask.cumsum(1) - 1).masked_fill(mask == 0, 0)
    return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


def run_threads(*targets):
    """Run each target in its own thread; re-raise the first failure here."""
    errors = []

    def guarded(target):
        try:
            target()
        except BaseException as e:  # noqa: BLE001 (an assertion in a thread must fail the test)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads), "a thread is still waiting"
    if errors:
        raise errors[0]


def wait(event: threading.Event) -> None:
    assert event.wait(WAIT_S), "timed out waiting for the other thread"


def assert_untouched(model, head, logits) -> None:
    """The model holds its own head, unchanged, and computes the logits it computed before."""
    assert model.get_output_embeddings() is head
    assert "forward" not in vars(head)
    torch.testing.assert_close(forward(model), logits)


@pytest.mark.parametrize("name", ["t5", "t5-untied", "gpt2", "llama"])
def test_hidden_outputs_are_what_the_head_reads(name):
    """Within the block the model returns its head's input: logits = hidden @ W.T as the
    model computes them (T5's tied d_model**-0.5 scaling and the decoder-only final norms included)."""
    model = gated_t5_model() if name == "t5-untied" else MODELS[name]()
    head = model.get_output_embeddings()
    logits = forward(model)
    with hidden_outputs(model):
        hidden = forward(model)
    assert hidden.shape[-1] == head.in_features != logits.shape[-1]
    torch.testing.assert_close(hidden @ head.weight.detach().T, logits, rtol=1e-5, atol=1e-5)
    assert_untouched(model, head, logits)
    with pytest.raises(RuntimeError, match="inside"):
        with hidden_outputs(model):
            raise RuntimeError("inside")
    assert_untouched(model, head, logits)


def test_nested_blocks_in_one_thread():
    """With the head swapped for the identity, an inner block found no head and raised
    'has no linear output projection'."""
    model = MODELS["llama"]()
    head, logits = model.get_output_embeddings(), forward(model)
    with hidden_outputs(model):
        hidden = forward(model)
        with hidden_outputs(model):
            torch.testing.assert_close(forward(model), hidden)
        torch.testing.assert_close(forward(model), hidden)
    assert hidden.shape[-1] == head.in_features
    assert_untouched(model, head, logits)


def test_interleaved_blocks_leave_the_model_intact():
    """A enters, B enters, A leaves, B leaves. With the head swapped for the identity, B found no head
    ('has no linear output projection'); had B read the head between A's check and A's swap, it
    would have saved the identity and put it back last, leaving the model without its head for good.
    A plain forward in a third thread meanwhile read hidden states for logits."""
    model = MODELS["t5"]()
    head, logits = model.get_output_embeddings(), forward(model)
    a_in, b_in, a_out, checked = (threading.Event() for _ in range(4))

    def a():
        with hidden_outputs(model):
            a_in.set()
            wait(b_in)
            assert forward(model).shape[-1] == head.in_features
        a_out.set()

    def b():
        wait(a_in)
        with hidden_outputs(model):
            b_in.set()
            wait(checked)
            assert forward(model).shape[-1] == head.in_features

    def plain():
        wait(b_in)                           # both inside
        torch.testing.assert_close(forward(model), logits)
        wait(a_out)                          # B still inside
        torch.testing.assert_close(forward(model), logits)
        checked.set()

    run_threads(a, b, plain)
    assert_untouched(model, head, logits)


@pytest.mark.parametrize("name", ["t5", "gpt2", "llama"])
def test_forward_and_generate_during_a_decode(name):
    """A ZeroGR decode paused inside the model's forward while another thread runs the model's
    own forward and generate: those get logits, the decode the beams it gets alone."""
    model, index = MODELS[name](), build_index(tiny_catalog())
    ids, mask = inputs()
    head, logits = model.get_output_embeddings(), forward(model)
    alone = generate(model, ids, index, beam_width=5, token_offsets=OFFSETS, attention_mask=mask)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    paused, resume = threading.Event(), threading.Event()
    result = {}

    def pause(module, args, kwargs):
        if threading.current_thread().name == "zerogr" and not paused.is_set():
            paused.set()                     # inside the ZeroGR forward (step 0), before its head
            wait(resume)

    hook = model.get_decoder().register_forward_pre_hook(pause, with_kwargs=True)

    def decode():
        try:
            result["decode"] = generate(model, ids, index, beam_width=5, token_offsets=OFFSETS, attention_mask=mask)
        except BaseException as e:  # noqa: BLE001 (reported below, in the test's thread)
            result["decode"] = e

    def plain():
        wait(paused)
        try:
            torch.testing.assert_close(forward(model), logits)
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
            assert torch.equal(out, expected)
        finally:
            resume.set()

    worker = threading.Thread(target=decode, name="zerogr")
    try:
        worker.start()
        run_threads(plain)
    finally:
        resume.set()
        worker.join(WAIT_S)
        hook.remove()
    got = result["decode"]
    if isinstance(got, BaseException):
        raise got
    assert torch.equal(got.item_rows, alone.item_rows)
    torch.testing.assert_close(got.scores, alone.scores)
    assert_untouched(model, head, logits)


def test_logits_computed_without_the_projection_are_refused():
    """A model that multiplies by its projection's weight without calling the module returns logits
    inside the block too; the decoder would read them as hidden states."""
    model = MODELS["gpt2"]()
    weight = model.get_output_embeddings().weight

    def direct(module, args, out):
        if out.logits.shape[-1] != weight.shape[0]:
            out.logits = torch.nn.functional.linear(out.logits, weight)
        return out

    model.register_forward_hook(direct)
    step = HFStepModel(model, OFFSETS)
    ids, mask = inputs()
    step.prefill(ids, mask, beam_width=2)
    with pytest.raises(ZeroGRError, match=r"^model: GPT2LMHeadModel computes its logits without calling its output "
                                          r"projection, so its hidden states cannot be read \(20 outputs, hidden "
                                          r"size 16\)$"):
        step.step(0, None, None)


@pytest.mark.parametrize("name", ["t5", "gpt2"])
def test_one_generator_shared_by_two_threads(name):
    """One HFGenerator, two threads: B's call while A's decode is paused inside the model's forward.
    Its step model holds one batch; B's prefill overwrote A's requests and A then decoded B's. Each now
    gets the beams it gets alone (B waits for A)."""
    from zerogr_core.hf import HFGenerator

    model, index = MODELS[name](), build_index(tiny_catalog())
    ids_a, mask = inputs()
    ids_b = ids_a.flip(0)
    gen = HFGenerator(model, index, beam_width=5, token_offsets=OFFSETS)
    alone = {"a": gen.generate(ids_a, mask), "b": gen.generate(ids_b, mask.flip(0))}
    paused, resume, b_done = threading.Event(), threading.Event(), threading.Event()
    result = {}

    def pause(module, args, kwargs):
        if threading.current_thread().name == "a" and not paused.is_set():
            paused.set()                     # A prefilled, inside its first forward
            wait(resume)

    hook = model.get_decoder().register_forward_pre_hook(pause, with_kwargs=True)

    def call(key, ids, m):
        try:
            result[key] = gen.generate(ids, m)
        except BaseException as e:  # noqa: BLE001 (reported below, in the test's thread)
            result[key] = e
        if key == "b":
            b_done.set()

    a = threading.Thread(target=call, args=("a", ids_a, mask), name="a")
    b = threading.Thread(target=call, args=("b", ids_b, mask.flip(0)), name="b")
    try:
        a.start()
        wait(paused)
        b.start()
        b_done.wait(2.0)                     # unguarded, B finishes its whole call meanwhile
        resume.set()
        for t in (a, b):
            t.join(WAIT_S)
    finally:
        resume.set()
        hook.remove()
    for key in ("a", "b"):
        got = result[key]
        if isinstance(got, BaseException):
            raise got
        assert torch.equal(got.item_rows, alone[key].item_rows), f"{key}: {got.item_rows.tolist()}"
        torch.testing.assert_close(got.scores, alone[key].scores)
