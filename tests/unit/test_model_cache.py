"""The model cache: atomic builds, SHA-256 manifests, corruption found and repaired."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from parley.config import Settings
from parley.engines import cache
from parley.engines.cache import MANIFEST, CacheError, ensure_folder, verify_folder
from parley.engines.whisper_cache import (
    WHISPER_BASE_SHA256,
    WHISPER_BASE_SIZE,
    WHISPER_TINY_EN_SHA256,
    packaged_whisper_dir,
    whisper_source,
)


@pytest.fixture(scope="module")
def whisper_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def bump_mtime(path: Path) -> None:
    # Coarse filesystem clocks can give a rewrite within the same tick the old mtime: make it differ.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_packaged_whisper_is_assembled_and_verified(whisper_cache: Path) -> None:
    folder = packaged_whisper_dir(whisper_cache)

    assert folder == whisper_cache / "whisper-base"
    assert (folder / "model.bin").stat().st_size == WHISPER_BASE_SIZE
    manifest = json.loads((folder / MANIFEST).read_text())["files"]
    for name, sha in WHISPER_BASE_SHA256.items():
        assert manifest[name]["sha256"] == sha
    assert verify_folder(folder, WHISPER_BASE_SHA256, full=True)
    assert not list(whisper_cache.glob(".tmp-*"))


def test_a_verified_cache_is_reused_without_hashing(
    whisper_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = packaged_whisper_dir(whisper_cache)
    inode = (folder / "model.bin").stat().st_ino

    def no_hashing(path: Path) -> str:
        raise AssertionError(f"hashed {path}")

    monkeypatch.setattr(cache, "sha256_file", no_hashing)

    assert packaged_whisper_dir(whisper_cache) == folder
    assert (folder / "model.bin").stat().st_ino == inode


def test_a_corrupted_model_is_detected_and_rebuilt(whisper_cache: Path) -> None:
    folder = packaged_whisper_dir(whisper_cache)
    model = folder / "model.bin"
    with model.open("r+b") as f:
        f.seek(WHISPER_BASE_SIZE // 2)
        byte = f.read(1)
        f.seek(WHISPER_BASE_SIZE // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    bump_mtime(model)

    assert not verify_folder(folder, WHISPER_BASE_SHA256)
    packaged_whisper_dir(whisper_cache)

    assert verify_folder(folder, WHISPER_BASE_SHA256, full=True)


def test_a_full_check_finds_corruption_that_kept_size_and_mtime(whisper_cache: Path) -> None:
    folder = packaged_whisper_dir(whisper_cache)
    vocabulary = folder / "vocabulary.json"
    st = vocabulary.stat()
    data = bytearray(vocabulary.read_bytes())
    data[100] ^= 0x01
    vocabulary.write_bytes(bytes(data))
    os.utime(vocabulary, ns=(st.st_atime_ns, st.st_mtime_ns))

    assert verify_folder(folder, WHISPER_BASE_SHA256)  # the start-up fast path trusts size and mtime
    assert not verify_folder(folder, WHISPER_BASE_SHA256, full=True)
    packaged_whisper_dir(whisper_cache, full=True)  # what `parley prepare` does

    assert verify_folder(folder, WHISPER_BASE_SHA256, full=True)


@pytest.mark.parametrize("damage", ["truncate", "delete", "manifest"])
def test_other_damage_is_detected_and_rebuilt(whisper_cache: Path, damage: str) -> None:
    folder = packaged_whisper_dir(whisper_cache)
    if damage == "truncate":
        (folder / "config.json").write_text("{}")
    elif damage == "delete":
        (folder / "tokenizer.json").unlink()
    else:
        (folder / MANIFEST).write_text("not json")

    assert not verify_folder(folder, WHISPER_BASE_SHA256)
    packaged_whisper_dir(whisper_cache)

    assert verify_folder(folder, WHISPER_BASE_SHA256, full=True)


def test_a_touched_file_is_rehashed_once_and_then_trusted(
    whisper_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = packaged_whisper_dir(whisper_cache)
    bump_mtime(folder / "config.json")
    hashed: list[str] = []
    real = cache.sha256_file

    def counting(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(cache, "sha256_file", counting)

    assert verify_folder(folder, WHISPER_BASE_SHA256)
    assert verify_folder(folder, WHISPER_BASE_SHA256)
    assert hashed == ["config.json"]


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    def broken(out: Path) -> None:
        (out / "half.bin").write_bytes(b"x" * 100)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ensure_folder(tmp_path / "model", broken)

    assert not (tmp_path / "model").exists()
    assert [p.name for p in tmp_path.iterdir()] == [".model.lock"]


def test_a_build_that_does_not_match_its_pins_is_refused(tmp_path: Path) -> None:
    def build(out: Path) -> None:
        (out / "weights.bin").write_bytes(b"not the pinned weights")

    with pytest.raises(CacheError, match="pinned"):
        ensure_folder(tmp_path / "model", build, pinned={"weights.bin": "0" * 64})

    assert not (tmp_path / "model").exists()


def test_leftovers_of_a_crashed_build_are_cleaned_up(tmp_path: Path) -> None:
    (tmp_path / ".tmp-model-abc123").mkdir()
    (tmp_path / ".tmp-model-abc123" / "partial.bin").write_bytes(b"x")

    folder = ensure_folder(tmp_path / "model", lambda out: (out / "w.bin").write_bytes(b"w"))

    assert (folder / "w.bin").read_bytes() == b"w"
    assert not (tmp_path / ".tmp-model-abc123").exists()


def test_the_converted_llm_in_the_default_cache_verifies() -> None:
    settings = Settings()
    folder = cache.llm_ct2_dir(settings.resolved_cache_dir(), settings.local_llm())

    assert cache.is_ct2_folder(folder)
    assert verify_folder(folder)
    assert (folder / "tokenizer.json").is_file()


def test_a_local_ctranslate2_folder_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")

    assert cache.llm_ct2_dir(tmp_path / "unused-cache", str(tmp_path)) == tmp_path


def split_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sha256: str) -> cache.PackagedLlm:
    """A packaged LLM in three parts, in three fake packages."""
    for i, chunk in enumerate((b"GGUF", b"-weights-", b"end"), start=1):
        (tmp_path / f"part{i}").mkdir()
        (tmp_path / f"part{i}" / "data.bin").write_bytes(chunk)
    monkeypatch.setattr(cache, "package_dir", lambda module: tmp_path / module)
    return cache.PackagedLlm(
        name="split",
        packages=("part1", "part2", "part3"),
        files=("data.bin",) * 3,
        source="test",
        gguf_size=16,
        gguf_sha256=sha256,
    )


def test_a_model_split_over_packages_is_joined_in_order_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    llm = split_llm(tmp_path, monkeypatch, hashlib.sha256(b"GGUF-weights-end").hexdigest())
    (tmp_path / "scratch").mkdir()

    joined = cache._packaged_gguf(llm, tmp_path / "scratch")

    assert joined.read_bytes() == b"GGUF-weights-end"


def test_a_joined_model_that_is_not_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = split_llm(tmp_path, monkeypatch, "0" * 64)
    (tmp_path / "scratch").mkdir()

    with pytest.raises(CacheError, match="pinned"):
        cache._packaged_gguf(llm, tmp_path / "scratch")


def test_a_model_with_a_part_not_installed_names_the_packages_to_install(tmp_path: Path) -> None:
    llm = cache.PackagedLlm(
        name="split",
        packages=("json", "parley_no_such_part"),
        files=("__init__.py", "data.bin"),
        source="split-part1-2==1.0",
    )

    with pytest.raises(CacheError, match=r"split needs split-part1-2==1\.0 installed: .*parley_no_such_part"):
        cache._packaged_gguf(llm, tmp_path)


def test_the_packaged_llms_are_known_by_name() -> None:
    assert {"qwen2.5-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"} <= set(cache.PACKAGED_LLMS)
    for name in ("qwen2.5-0.5b", "qwen2.5-coder-1.5b"):
        pinned = cache.PACKAGED_LLMS[name].gguf_sha256  # their packages ship no checksum of their own
        assert pinned is not None and len(pinned) == 64


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-coder-1.5b"])
def test_every_part_of_a_split_llm_is_installed_and_they_add_up_to_its_file(name: str) -> None:
    llm = cache.PACKAGED_LLMS[name]
    parts = [cache.package_dir(module) / file for module, file in zip(llm.packages, llm.files, strict=True)]

    assert sum(part.stat().st_size for part in parts) == llm.gguf_size


def test_stt_model_names_resolve_to_packaged_folders_or_paths(whisper_cache: Path, tmp_path: Path) -> None:
    assert whisper_source("base", whisper_cache) == str(whisper_cache / "whisper-base")
    tiny = Path(whisper_source("tiny.en", whisper_cache))
    assert tiny == whisper_cache / "whisper-tiny.en"
    assert verify_folder(tiny, WHISPER_TINY_EN_SHA256, full=True)
    assert whisper_source(str(tmp_path), whisper_cache) == str(tmp_path)  # a CTranslate2 folder, as given
    with pytest.raises(ValueError, match="cache folder"):
        whisper_source("tiny.en", None)
