"""How many thread-block clusters fit on a GPU at once, asked of the CUDA driver (no CuTe DSL).

Owns ``max_active_clusters(cluster_size)``: the clusters of ``cluster_size`` CTAs, each CTA
taking a whole SM (all of its shared memory), that can be resident at once on the device of
the current CUDA context. A GPC's SM count need not divide by the cluster size, so this can be below
SMs / cluster_size (the persistent SM90 grid is sized by it). The driver answers for a
kernel: an empty one, given as PTX text that the driver compiles once per process, so no
compiler and no DSL is involved (the DSL's ``HardwareInfo`` compiles one with
``cute.compile`` on each call). Needs a current CUDA context (torch and JAX make one) and
cuda-python's driver bindings; raises RuntimeError on a driver error or without a context
(and cuda-python's own error where no driver is installed).
"""
from __future__ import annotations

import threading
from typing import Dict, Hashable

from . import caches

#: An empty kernel (PTX 7.8: the first ISA with sm_90 and clusters)
_PTX = (b".version 7.8\n.target sm_90\n.address_size 64\n"
        b".visible .entry cudnn_ext_occupancy_probe()\n{\n\tret;\n}\n\0")
_NAME = b"cudnn_ext_occupancy_probe"
#: CTA size of the query, as the DSL's HardwareInfo asks (one CTA per SM either way: it
#: takes all the shared memory)
_THREADS = 128

_lock = threading.Lock()
_library = None
_functions: Dict[int, object] = {}  # context handle -> the probe's CUfunction in it


def _ok(result):
    """The values of a cuda-python driver call's result tuple; RuntimeError on an error."""
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver error {int(err)} ({name!r}) in the occupancy query")
    return values[0] if len(values) == 1 else tuple(values)


def _probe(context: int):
    """The empty kernel as a function of the current context, ``context`` (a library is
    loaded once per process; its function once per context)."""
    global _library
    from cuda.bindings import driver

    with _lock:
        fn = _functions.get(context)
        if fn is None:
            if _library is None:
                _library = _ok(driver.cuLibraryLoadData(_PTX, None, None, 0, None, None, 0))
            kernel = _ok(driver.cuLibraryGetKernel(_library, _NAME))
            fn = _functions[context] = _ok(driver.cuKernelGetFunction(kernel))
    return fn


def max_active_clusters(cluster_size: int) -> int:
    """Clusters of ``cluster_size`` (1..32) CTAs, each holding a whole SM, that can be
    resident at once on the current context's device."""
    if not 1 <= cluster_size <= 32:
        raise ValueError(f"cluster_size: must be in 1..32, got {cluster_size}")
    from cuda.bindings import driver

    attr, fattr = driver.CUdevice_attribute, driver.CUfunction_attribute
    context = int(_ok(driver.cuCtxGetCurrent()))
    if not context:
        raise RuntimeError("the occupancy query needs a current CUDA context, there is none")
    fn = _probe(context)
    device = _ok(driver.cuCtxGetDevice())
    smem = _ok(driver.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device))
    _ok(driver.cuFuncSetAttribute(fn, fattr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    dynamic = _ok(driver.cuOccupancyAvailableDynamicSMemPerBlock(fn, 1, 1))
    blocks = _ok(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 1, dynamic))
    # cluster sizes above 8 are non-portable; allowed so that the driver answers for them
    _ok(driver.cuFuncSetAttribute(
        fn, fattr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
    cluster = driver.CUlaunchAttribute()
    cluster.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    value = driver.CUlaunchAttributeValue()
    value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = cluster_size, 1, 1
    cluster.value = value
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster_size, max(blocks, 1), 1
    config.blockDimX, config.blockDimY, config.blockDimZ = _THREADS, 1, 1
    config.sharedMemBytes = dynamic
    config.numAttrs = 1
    config.attrs = [cluster]
    return int(_ok(driver.cuOccupancyMaxActiveClusters(fn, config)))


#: (device, SM count, cluster size) -> resident CTAs: the process's one such cache
_RESIDENT: Dict[tuple, int] = {}
caches.register("resident CTAs", _RESIDENT.clear, lambda: len(_RESIDENT))


def resident_ctas(sms: int, cluster_size: int, device: Hashable = None) -> int:
    """CTAs of a persistent launch that can be resident at once on the current device: the
    SM count, or for clusters max active clusters x cluster size (a GPC's SM count need not
    divide by the cluster size, and a cluster that cannot be co-resident would run after the
    others). Asks the driver under the current CUDA context once per (``device``, SM count,
    cluster size); raises if it cannot (nothing is cached then)."""
    if cluster_size == 1:
        return sms
    key = (device, sms, cluster_size)
    n = _RESIDENT.get(key)
    if n is None:
        n = _RESIDENT[key] = min(sms, max_active_clusters(cluster_size) * cluster_size)
    return n
