"""The comparisons of `scalelab reproduce`: params, metric histories and weights, as `Check` rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TIMING_METRICS = (
    "samples_per_s",
    "step_time_ms",
    "mean_samples_per_s",
    "mean_step_time_ms",
    "profile_trace_bytes",
)
# a sweep's pre-made run (the reproduction gets its own); where the job ran (reproduce runs it here,
# its SLURM folder in its own temporary folder, its checkpoints on its own disk): none changes the weights
IGNORED_PARAMS = ("tracking.run_id", "train.launcher", "train.checkpoint_dir", "slurm.folder")
SWEEP_LABELS = ("override.", "sampled.")  # a sweep's copies of the values it set (train.* hold them too)


@dataclass(frozen=True)
class Check:
    name: str
    original: str
    reproduced: str
    status: str  # "match", "MISMATCH" or "skipped: <why>"


def short(value: Any, width: int = 24) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _history(client: Any, run_id: str, key: str) -> dict[int, float]:
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in history}  # a step logged twice: the later value


def _same(a: float, b: float, rtol: float, atol: float) -> bool:
    if a != a or b != b:  # NaN
        return a != a and b != b
    return a == b if rtol == 0 and atol == 0 else abs(a - b) <= atol + rtol * abs(b)


def compare_metrics(client: Any, old: Any, new: Any, rtol: float, atol: float) -> list[Check]:
    """Every metric's whole history, step by step; timing and system metrics are skipped."""
    checks = []
    for key in sorted(old.data.metrics):
        if key.startswith("system/") or key in TIMING_METRICS:
            checks.append(
                Check(
                    f"metric {key}",
                    short(old.data.metrics[key]),
                    short(new.data.metrics.get(key, "(absent)")),
                    "skipped: timing/system",
                )
            )
            continue
        a, b = _history(client, old.info.run_id, key), _history(client, new.info.run_id, key)
        ok = a.keys() == b.keys() and all(_same(a[s], b[s], rtol, atol) for s in a)
        last = max(a) if a else None
        checks.append(
            Check(
                f"metric {key} ({len(a)} steps)",
                repr(a.get(last)),
                repr(b.get(last, "(absent)")),
                "match" if ok else "MISMATCH",
            )
        )
    return checks


def compare_params(old: Any, new: Any) -> list[Check]:
    """Every param, seeds included (seed.base, seed.rank.N, the rules, the deterministic flag)."""
    names = (set(old.data.params) | set(new.data.params)) - set(IGNORED_PARAMS)
    keys = sorted(k for k in names if not k.startswith(SWEEP_LABELS))
    differ = [k for k in keys if old.data.params.get(k) != new.data.params.get(k)]
    seeds = [k for k in keys if k.startswith("seed.")]
    checks = [
        Check(f"param {k}", short(old.data.params.get(k)), short(new.data.params.get(k)), "MISMATCH") for k in differ
    ]
    checks.append(
        Check(
            f"params ({len(keys)}, {len(seeds)} seed entries)",
            f"{len(keys)} recorded",
            f"{len(keys) - len(differ)} equal",
            "match" if not differ else "MISMATCH",
        )
    )
    return checks


def on_gpu(old: Any, new: Any) -> bool:
    """Either run trained on CUDA: its kernels are not bitwise reproducible across runs or against a
    CPU run, so metrics are compared within tolerance and weights are not compared."""
    return "cuda" in (old.data.tags.get("scalelab.device"), new.data.tags.get("scalelab.device"))


def compare_weights(old: Any, new: Any, on_gpu: bool) -> Check:
    a, b = old.data.tags.get("weights.sha256"), new.data.tags.get("weights.sha256")
    if a is None:
        return Check("weights sha256", "(not recorded)", short(b), "skipped: not recorded by the run")
    if a != b and on_gpu:
        return Check("weights sha256", short(a), short(b), "skipped: GPU runs are compared by metrics")
    return Check("weights sha256", short(a), short(b), "match" if a == b else "MISMATCH")


def table(checks: list[Check]) -> str:
    """The checks as an aligned text table."""
    rows = [("check", "original", "reproduced", "result")]
    rows += [(c.name, c.original, c.reproduced, c.status) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows)
