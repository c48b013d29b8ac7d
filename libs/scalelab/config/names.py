"""The optimizers and LR schedules params.yaml may name: one table each, the only list of them.

The schema's allowed values (`train.optimizer`, `train.lr_schedule`) are these keys, and training
builds exactly these (`training.loop.OPTIMIZERS`, `training.schedule.DECAYS`, keyed the same and
checked by a test); any other name is refused with the list, never built as a fallback. To add
one, add its row here and its builder there.
"""

from __future__ import annotations

from scalelab.config.loader import ConfigError

OPTIMIZERS = {
    "adamw": "torch.optim.AdamW(lr, weight_decay)",
    "sgd": "torch.optim.SGD(lr, momentum, weight_decay)",
}
LR_SCHEDULES = {
    "constant": "the lr after the warm-up",
    "cosine": "a cosine decay to lr * min_lr_ratio at the last step",
    "linear": "a linear decay to lr * min_lr_ratio at the last step",
}


def check(key: str, value: str, table: dict[str, str]) -> str:
    """`value` if it is a key of `table`.

    Raises:
        ConfigError: naming `key`, the value and the allowed names.
    """
    if value not in table:
        allowed = " | ".join(repr(n) for n in table)
        raise ConfigError(f"{key} = {value!r} is not allowed: expected one of {allowed}")
    return value
