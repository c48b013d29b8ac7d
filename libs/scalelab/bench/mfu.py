"""Model FLOPs utilization of the small GPT-style workload (experiments/gpt.py): achieved FLOP/s / peak
(on CUDA: `scalelab bench mfu --device cuda --precision bf16`; elsewhere `--peak-tflops`)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from scalelab.bench import harness, stats
from scalelab.bench.harness import Goal, opt
from scalelab.runtime.repeats import timed_repeats

METHOD = """\
One process times the training step of experiments/gpt.py (Loop.step, strategy single: forward, next-token
cross-entropy, backward, AdamW) on two synthetic token batches on the device. Warm-up steps untimed; each
repeat times its steps (CUDA synchronized around them); busy repeats retried or dropped; the figure is the
median step. FLOPs per step, analytic: (6*N + 12*n_layer*d_model*seq) * batch*seq (Kaplan et al. 2020;
PaLM's 6N + 12LHQT), N the parameters in matrix products (not the embeddings; the untied head counted).
Cross-check: one step under FlopCounterMode (a few percent high). MFU = achieved / peak: --peak-tflops,
else on CUDA in bf16 the device's dense peak by name (PEAK_TFLOPS_BF16), else null ("not measured").
"""
GOAL = Goal(">=", 0.30, "MFU >= 30%")  # of the peak: the low end of what torchtitan reports on H100 (33-39%)
SEED = 0  # of the weights and the random tokens
NO_PEAK = "peak FLOP/s unknown for this device; pass --peak-tflops"
# dense bf16 tensor-core peaks (no sparsity), TFLOP/s, by a substring of the CUDA device name: first match wins
PEAK_TFLOPS_BF16 = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))


def _shapes(formula: Any, n: int) -> Any:
    """A FlopCounterMode formula: torch's SDPA `formula` on the kernel's first `n` shapes."""
    return lambda *shapes, **_: formula(*shapes[:n])


# FlopCounterMode has no formula for the CPU flash-attention kernels: torch's own SDPA ones, applied
CPU_SDPA = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _shapes(sdpa_flop_count, 3),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _shapes(sdpa_backward_flop_count, 4),
}


def model_config(args: Any) -> dict[str, Any]:
    """The gpt workload's model section from the command line, after refusing bad sizes and peaks."""
    for key in ("steps", "repeats", "batch", "seq", "layers", "d_model", "vocab"):
        if getattr(args, key) < 1:
            raise ValueError(f"--{key.replace('_', '-')} = {getattr(args, key)} is not allowed: give a number >= 1")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        raise ValueError(f"--peak-tflops = {args.peak_tflops} is not allowed: give a peak > 0")
    model = {"vocab_size": args.vocab, "seq_len": args.seq, "d_model": args.d_model, "layers": args.layers}
    return model | {"heads": max(1, args.d_model // 64)}


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in matrix products: all but the embedding tables."""
    lookups = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in lookups)


def peak_tflops(device: torch.device, precision: str, given: float | None) -> tuple[float | None, str | None]:
    """(peak TFLOP/s or None, where it came from)."""
    if given is not None:  # checked > 0 by model_config, before anything runs
        return given, "--peak-tflops"
    if device.type == "cuda" and precision == "bf16":
        name = torch.cuda.get_device_name(device)
        for key, peak in PEAK_TFLOPS_BF16:
            if key in name:
                return peak, f"table: {key} dense bf16"
    return None, None


def measure_steps(args: Any, policy: dict[str, Any]) -> dict[str, Any]:
    """Builds the workload and its loop, counts one step's FLOPs, times the repeats."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
    model = model_config(args)
    spec = {"workload": "gpt", "model": model, "input_shape": [args.seq], "num_classes": args.vocab, "seed": SEED}
    spec |= {"device": args.device, "strategy": "single", "precision": args.precision, "batch": args.batch}
    rank = harness.rank_loop(spec | {"optim": {"name": "adamw", "lr": 3e-4}, "threads": torch.get_num_threads()})
    loop, pool, device = rank.loop, rank.batches, rank.device
    for i in range(args.warmup_steps):
        loop.step([pool[i % 2]])
    with FlopCounterMode(display=False, custom_mapping=CPU_SDPA) as counter:
        loop.step([pool[0]])
    last: dict[str, torch.Tensor] = {}
    step = {"step": lambda i: last.update(loss=loop.step([pool[i % 2]]))}
    reps = harness.take_repeats(
        lambda i: sum(timed_repeats(step, repeats=1, steps=args.steps, device=device)["step"][0]) / args.steps, policy
    )
    n_matmul, tokens = matmul_params(rank.wl.model), args.batch * args.seq
    per_token = 6 * n_matmul + 12 * args.layers * args.d_model * args.seq  # weights' forward and backward, attention
    return {
        "model": model, "params": sum(p.numel() for p in rank.wl.model.parameters()), "matmul_params": n_matmul,
        "tokens_per_step": tokens, "flops_per_step_counted": int(counter.get_total_flops()),
        "flops_per_step_analytic": per_token * tokens, "step_time_s": reps.kept, "final_loss": float(last["loss"]),
        "device": device, "busy": reps,
    }  # fmt: skip


def measure(ctx: harness.Context) -> dict[str, Any]:
    """The step's FLOPs and time, and MFU against the device's peak (null without one)."""
    args, m = ctx.args, measure_steps(ctx.args, ctx.policy())
    device, reps, tokens = m.pop("device"), m.pop("busy"), m.pop("tokens_per_step")
    median_s = stats.median(m["step_time_s"])
    achieved = m["flops_per_step_analytic"] / median_s / 1e12
    peak, peak_source = peak_tflops(device, args.precision, args.peak_tflops)
    mfu = achieved / peak if peak else None
    config = {**m.pop("model"), "batch": args.batch, "tokens_per_step": tokens, "steps_per_repeat": args.steps}
    config |= {"warmup_steps": args.warmup_steps, "optimizer": "adamw", "strategy": "single", "seed": SEED}
    where = f"cpu: {stats.machine()['cpu']}, {torch.get_num_threads()} torch threads"
    r = {
        "device": f"cuda: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else where,
        "precision": args.precision, "config": config, **m, "step_time_s_median": median_s, "repeats": args.repeats,
        "achieved_tflops": achieved, "peak_tflops": peak, "peak_source": peak_source, "mfu": mfu,
        "mfu_reason": None if peak else NO_PEAK, **reps.json(), "torch": torch.__version__,
    }  # fmt: skip
    size = f"{config['layers']} layers, d_model {config['d_model']}, seq {config['seq_len']}, batch {args.batch}"
    text = f"{achieved * 1e3:.3g} GFLOP/s achieved ({args.precision}, {r['device']}; {size})"
    text += f"; MFU null: {NO_PEAK}" if mfu is None else f"; MFU {100 * mfu:.1f}% of {peak:g} TFLOP/s ({peak_source})"
    ctx.figure("mfu", text, mfu, GOAL, dropped=reps.dropped)
    return r


OPTIONS = (
    opt("--device", "cpu", "where to run", choices=["cpu", "cuda"]),
    opt("--precision", "fp32", "bf16: autocast", choices=["fp32", "bf16"]),
    opt("--steps", 5, "timed steps per repeat"),
    opt("--repeats", 5, "timed repeats"),
    opt("--warmup-steps", 2, "untimed steps first"),
    opt("--batch", 8, "sequences per step"),
    opt("--seq", 128, "tokens per sequence"),
    opt("--layers", 2, "transformer blocks"),
    opt("--d-model", 128, "model width"),
    opt("--vocab", 512, "vocabulary size, tokens"),
    opt("--peak-tflops", None, "the device's peak, TFLOP/s (default: table)", type=float),
)
BENCH = harness.Benchmark("mfu", "mfu.json", METHOD, measure, OPTIONS)
