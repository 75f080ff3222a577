"""scripts/bf16_rounding.py: its row-by-row attention computes the same attention as the
engine's, and its row-count scan partitions the row counts."""

import importlib.util
import random
from pathlib import Path
from types import ModuleType

import torch
from helpers import REPO, tiny_model

from toolspec import TargetModel
from toolspec.core.draft_tree import DraftTree

SCRIPT = REPO / "scripts" / "bf16_rounding.py"
VOCAB = 96


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bf16_rounding", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree_logits(model, prompt: list[int], tree: DraftTree) -> torch.Tensor:
    target = TargetModel(model)
    cache = target.new_cache()
    target.prefill(cache, prompt[:-1])
    return target.forward_tree(cache, prompt[-1:], tree)


def test_row_by_row_attention_matches_the_engines() -> None:
    script = _script()
    model = tiny_model("qwen2", VOCAB)
    rng = random.Random(0)
    prompt = [rng.randrange(VOCAB) for _ in range(30)]
    # Branching, so some rows' ancestors are not contiguous (their keys are gathered).
    tree = DraftTree.from_sequences([([5, 6, 7, 8], "a"), ([5, 9, 4], "b"), ([10, 11], "c")])
    engine = _tree_logits(model, prompt, tree)
    script.use_row_by_row_attention(model)
    assert model.config._attn_implementation == script.ROW_BY_ROW
    torch.testing.assert_close(_tree_logits(model, prompt, tree), engine, rtol=1e-5, atol=1e-5)


def test_linear_row_groups_partition_the_row_counts() -> None:
    script = _script()
    weight = torch.randn(24, 40)
    groups = script.linear_row_groups(weight, max_rows=16, trials=2)
    assert groups[0][0] == 1 and groups[-1][1] == 16
    assert all(later[0] == earlier[1] + 1 for earlier, later in zip(groups, groups[1:]))


def test_the_linear_tile_diagnostic_runs_and_reports_both_kernels(tmp_path: Path) -> None:
    """scripts/bf16_linear_tiles.py on a small shape: the report has both kernels, and a
    fixed tile computes each row from that row alone (what exact bf16 rests on)."""
    spec = importlib.util.spec_from_file_location(
        "bf16_linear_tiles", SCRIPT.parent / "bf16_linear_tiles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "tiles.json"
    assert module.main(["--small", "--tiles", "8,16", "--json", str(out)]) == 0
    import json
    report = json.loads(out.read_text())["small"]
    assert set(report) == {"stock", "packed", "packed_tiles"}
    assert all(report["packed_tiles"].values())
