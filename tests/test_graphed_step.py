"""The CUDA-graph training step against the eager step (the GPU part is skipped without CUDA)."""
import pytest
import torch

from zerogr_core.errors import ZeroGRError

transformers = pytest.importorskip("transformers")


def _setup(device):
    from zerogr_core.recsys.t5 import T5Config, T5Recommender

    torch.manual_seed(0)
    model = T5Recommender(T5Config(encoder_layers=1, decoder_layers=1, d_model=32, n_heads=2, d_kv=16, d_ff=64,
                                   dropout=0.0, max_items=5), (16, 16, 4)).to(device)
    sids = torch.stack([torch.randint(0, v, (200,)) for v in (16, 16, 4)], 1).to(device)
    rows = torch.randint(0, 200, (96, 5), device=device)
    lengths = torch.randint(1, 6, (96,), device=device)
    targets = torch.randint(0, 200, (96,), device=device)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")

    def body(idx, drawn):
        ids, mask = model.pack(rows[idx], lengths[idx], sids)
        loss = model.loss(ids, mask, sids[targets[idx]]).float()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        return loss.detach()

    return model, optim, body


def test_graphed_step_refuses_a_cpu_device():
    from zerogr_core.recsys.graphed_step import GraphedTrainStep

    _, optim, body = _setup(torch.device("cpu"))
    with pytest.raises(ZeroGRError, match="--cuda-graph: CUDA graphs need a CUDA device"):
        GraphedTrainStep(body, optim, 16, False, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_steps_follow_the_eager_steps():
    """Warm-up, capture and replays take the same steps as eager training (no dropout, no TF32)."""
    from zerogr_core.recsys.graphed_step import GraphedTrainStep

    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    batches = [torch.randperm(96, generator=torch.Generator().manual_seed(i))[:16].to(device) for i in range(8)]
    lrs = [1e-3 * (i + 1) / 8 for i in range(8)]
    model, optim, body = _setup(device)
    eager = []
    for idx, lr in zip(batches, lrs):
        for group in optim.param_groups:
            group["lr"] = lr
        optim.zero_grad(set_to_none=True)
        eager.append(float(body(idx, None)))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    model, optim, body = _setup(device)
    step = GraphedTrainStep(body, optim, 16, False, device, warmup=3)
    got = [float(step(idx, None, lr)) for idx, lr in zip(batches, lrs)]
    assert step.graph is not None and step.eager_steps == 3
    torch.testing.assert_close(torch.tensor(got), torch.tensor(eager), rtol=1e-5, atol=1e-6)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
    with pytest.raises(ZeroGRError, match="batches of 16"):
        step(batches[0][:5], None, 1e-3)
