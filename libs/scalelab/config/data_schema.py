"""The schema of params.yaml's `data` section (stage prepare): the source and each source's knobs.
Part of config.schema, which re-exports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from scalelab.config.loader import ConfigError, knob
from scalelab.config.names import DATA_SOURCES

DataSourceName = Literal[tuple(DATA_SOURCES)]  # config/names.py
MAX_SEED = 2**32 - 1  # NumPy and torch both take it
FROZEN = dict(frozen=True, kw_only=True, slots=True)


@dataclass(**FROZEN)
class SyntheticConfig:
    num_samples: int = knob(4096, ge=10)
    num_features: int = knob(32, ge=1)
    num_classes: int = knob(10, ge=2)
    noise: float = knob(1.0, ge=0.0, doc="std of the Gaussian noise around each class centre")


@dataclass(**FROZEN)
class FileConfig:
    path: str = knob("", doc="CSV or Parquet file; every column but the label is a feature")
    label_column: str = knob("label")
    standardize: bool = knob(False, doc="z-score every feature with the training split's mean and std")


GLOB_CHARACTERS = "*?["  # also in config.checkpoints


@dataclass(**FROZEN)
class TextConfig:
    path: str = knob("data/raw", doc="a UTF-8 file, or a folder of them (a dependency of prepare in dvc.yaml)")
    pattern: str = knob(
        "**/*", doc="the files read under a folder `path`: a glob ('**' recurses); hidden ones are left out"
    )
    separator: str = knob(
        "", doc="'': one document per file; else a document ends after each occurrence, e.g. '\\n\\n'"
    )
    tokenizer: Literal["bytes"] = knob("bytes", doc="bytes: one token per byte, a vocabulary of 256")

    def check(self, prefix: str) -> None:
        if not self.path:
            raise ConfigError(f"{prefix}.path = '' is not allowed: give a UTF-8 file or a folder")
        if any(c in self.path for c in GLOB_CHARACTERS):
            raise ConfigError(
                f"{prefix}.path = {self.path!r} is not allowed: give a file or a folder, and the glob in "
                f"{prefix}.pattern (DVC tracks the folder)"
            )


@dataclass(**FROZEN)
class JsonlConfig:
    path: str = knob("data/raw", doc="a JSON Lines file, or a folder of them (a dependency of prepare in dvc.yaml)")
    pattern: str = knob("**/*.jsonl", doc="the files read under a folder `path`: a glob; hidden ones are left out")
    field: str = knob("text", doc="the string field of each line's object that is one document; '' lines are skipped")
    tokenizer: Literal["bytes"] = knob("bytes", doc="bytes: one token per UTF-8 byte, a vocabulary of 256")

    def check(self, prefix: str) -> None:
        TextConfig.check(self, prefix)  # the same path rules
        if not self.field:
            raise ConfigError(f"{prefix}.field = '' is not allowed: name the string field that holds each document")


# what each data source gives a workload: feature rows with class labels, or a token stream
DATA_KINDS = {name: s.kind for name, s in DATA_SOURCES.items()}
VOCAB_SIZES = {"bytes": 256}
# what each kind of data is scored by (training.evaluation): logged as val_<score> every epoch
SCORES = {"features": ("loss", "accuracy"), "tokens": ("loss", "perplexity", "bits_per_byte")}


@dataclass(**FROZEN)
class DataConfig:
    source: DataSourceName = knob("digits", doc=" | ".join(DATA_SOURCES) + " (config/names.py)")
    seed: int = knob(0, ge=0, le=MAX_SEED, doc="seed of the synthetic generator and of the split")
    val_fraction: float = knob(0.1, gt=0.0, lt=0.5)
    test_fraction: float = knob(0.2, gt=0.0, lt=0.5)
    synthetic: SyntheticConfig = knob(SyntheticConfig())
    file: FileConfig = knob(FileConfig())
    text: TextConfig = knob(TextConfig())
    jsonl: JsonlConfig = knob(JsonlConfig())

    @property
    def kind(self) -> str:
        """What the source gives a workload: 'features' or 'tokens'."""
        return DATA_KINDS[self.source]

    @property
    def section(self) -> Any:
        """The knobs of the chosen source (data.text for text, ...); None for digits."""
        return getattr(self, self.source, None)

    def check(self, prefix: str) -> None:
        if self.source == "file" and not self.file.path:
            raise ConfigError(
                f"{prefix}.file.path = '' is not allowed when {prefix}.source = 'file': give the CSV or Parquet path"
            )
