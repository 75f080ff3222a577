import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(params=["qwen2", "llama"])
def tiny_family(request: pytest.FixtureRequest) -> str:
    return request.param
