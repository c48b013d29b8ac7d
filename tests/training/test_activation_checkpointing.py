"""train.activation_checkpointing: each shard unit recomputes its activations in backward. Same
loss and gradients (dropout's masks replayed), and far less kept for backward."""

import torch

from scalelab.training import strategy, workloads

GPT = {"layers": 4, "d_model": 64, "heads": 4, "seq_len": 64, "vocab_size": 256, "dropout": 0.1}


def step(activation_checkpointing: bool) -> tuple[int, float, list[torch.Tensor]]:
    """One forward and backward of a small GPT: the bytes of the tensors autograd keeps for backward
    (what activation checkpointing saves; seen through saved-tensor hooks), the loss, the gradients."""
    torch.manual_seed(0)
    wl = workloads.load("gpt", GPT, input_shape=[64], num_classes=256)
    model = strategy.get("single").wrap(wl.model, torch.device("cpu"), wl.shard_units, activation_checkpointing)
    x, y = torch.randint(0, 256, (8, 64)), torch.randint(0, 256, (8, 64))
    kept = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = wl.loss(model(x), y)
    loss.backward()
    return kept, loss.item(), [p.grad for p in model.parameters()]


def test_same_loss_and_gradients_with_less_kept_for_backward():
    kept_plain, loss_plain, grads_plain = step(False)
    kept_ac, loss_ac, grads_ac = step(True)
    assert loss_ac == loss_plain  # the same forward, dropout included (its RNG state is replayed)
    for a, b in zip(grads_plain, grads_ac):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the blocks' activations are recomputed: only what lies outside them (embeddings, head) is kept
    assert kept_ac < 0.3 * kept_plain, (kept_ac, kept_plain)
