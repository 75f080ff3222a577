"""Loading a target model for inference: device, dtype policy, tokenizer, and the kernels
it runs with (prepacked linear layers, exact bf16, grouped tree attention, tensor-parallel split).

Where the weights come from is ``toolspec.model.packages``.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.model.attention import EXACT_ROWS, use_grouped_tree_attention
from toolspec.model.packages import DEFAULT_MODEL, REGISTRY, resolve_model_dir
from toolspec.model.packed_linear import (
    EXACT_TILE_ROWS,
    cpu_supports_fast_bf16,
    exact_tiles_available,
    pack_linear_layers,
    packing_available,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A target model ready for inference, with the tokenizer that goes with it."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    dtype: torch.dtype
    device: torch.device
    prepacked_linear: bool = False  # linear weights prepacked for oneDNN (fp32 on CPU)
    tensor_parallel_size: int = 1  # ranks holding a part of every layer
                                   # (toolspec.model.tensor_parallel)
    exact_bf16: bool = False  # rows computed as one-row steps compute them (exact bf16)


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
    (``toolspec.model.tensor_parallel.init_group``); no weight packing then.

    ``exact_bf16`` (bf16 on a CPU with oneDNN; ignored elsewhere): every generated token's row
    gets bitwise the logits a one-row step gives it, whatever forward it is verified in — linear
    layers in fixed tiles of prepacked weights, attention row by row
    (``grouped_attention.exact_rows_attention``) — so speculative decoding reproduces plain
    decoding in bf16 as it does in fp32. Plain decoding runs through the same kernels.

    ``dtype`` defaults to bf16 where the hardware runs it fast, fp32 otherwise.
    ``prepack_linear``: linear weights are prepacked for oneDNN, which makes plain steps faster
    and verification forwards cheap (``toolspec.model.packed_linear``; fp32 on CPU only, ignored
    elsewhere).
    Tree forwards attend over grouped key/value heads as they are (``toolspec.model.attention``).
    """
    device = torch.device(device) if device is not None else default_device()
    if not isinstance(dtype, torch.dtype):
        dtype = parse_dtype(dtype, device)
    source = resolve_model_dir(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tensor_parallel_size > 1:
        from toolspec.model.tensor_parallel import check_divides, load_sharded

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
