import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_seed():
    # every test gets fresh random data unless it seeds itself; the seed is printed on failure
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    yield seed
