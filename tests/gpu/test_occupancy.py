"""The resident-cluster count on the device (``pytest -m gpu``; skipped without an sm_90 GPU):
``runtime.occupancy.max_active_clusters`` (the driver's answer for an empty PTX kernel, no
CuTe DSL) gives what the DSL's ``HardwareInfo`` gives for the sizes the engine launches
(1, 2, 4 CTAs), so the persistent SM90 grid is the same."""
import importlib.util

import pytest
import torch

from cudnn_ext.runtime.occupancy import max_active_clusters

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cluster_size", [1, 2, 4])
def test_max_active_clusters_matches_the_dsl(cluster_size):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    torch.zeros(1, device="cuda")  # the context the query runs in
    got = max_active_clusters(cluster_size)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert 0 < got * cluster_size <= sms, (got, sms)
    if importlib.util.find_spec("cutlass") is None:
        pytest.skip("nvidia-cutlass-dsl is not installed: no HardwareInfo to compare with")
    from cutlass.utils import HardwareInfo

    assert got == HardwareInfo(torch.cuda.current_device()).get_max_active_clusters(cluster_size)
