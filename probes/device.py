"""What the probe can learn about the GPU without torch: the CUDA driver via ctypes, and NVML.

Every function here either returns a value or raises `Unavailable` with a
one-line reason; nothing raises into the decode loop.
"""

from __future__ import annotations

import ctypes
import os
import sys

from decodemon.probes.frames import GpuInfo

_CU_ATTR_SM_COUNT = 16
_CU_ATTR_CC_MAJOR = 75
_CU_ATTR_CC_MINOR = 76


class Unavailable(RuntimeError):
    """The GPU, or one way of observing it, cannot be used here; str() says why."""


def cuda_device_index() -> int:
    """The CUDA device the process decodes on: DECODEMON_DEVICE, else 0."""
    try:
        return int(os.environ.get("DECODEMON_DEVICE", "0"))
    except ValueError:
        return 0


def nvml_index(cuda_index: int) -> int:
    """Map a CUDA ordinal to an NVML index through CUDA_VISIBLE_DEVICES when it lists numbers."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in vis.split(",") if p.strip()]
    if parts and cuda_index < len(parts) and parts[cuda_index].isdigit():
        return int(parts[cuda_index])
    return cuda_index


def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise Unavailable(f"CUDA driver is not found ({exc})") from None


def _uuid(cu, dev) -> str:
    """The device's UUID as NVML writes it ("GPU-8-4-4-4-12 hex"), from the CUDA driver ('' if it will not say)."""
    raw = ctypes.create_string_buffer(16)
    fn = getattr(cu, "cuDeviceGetUuid_v2", None) or getattr(cu, "cuDeviceGetUuid", None)
    if fn is None or fn(raw, dev) != 0:
        return ""
    h = raw.raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _nvml_peak_and_driver(pynvml, h) -> tuple[float, str]:
    """NVML's peak memory bandwidth (GB/s: bus width x max memory clock x 2) and driver version for handle `h`."""
    bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(h)
    mem_mhz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
    return bus_bits / 8 * mem_mhz * 1e6 * 2 / 1e9, str(pynvml.nvmlSystemGetDriverVersion())


def nvml_facts(gpu):
    """`gpu` with what NVML adds (peak memory bandwidth, driver version), found by its UUID: read in the monitor's
    process, so the target never loads NVML. `gpu` as it was where NVML cannot say."""
    if gpu.mem_bandwidth_gbs or not gpu.uuid:
        return gpu
    try:
        import msgspec
        import pynvml

        pynvml.nvmlInit()
        bw, driver = _nvml_peak_and_driver(pynvml, pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid))
        return msgspec.structs.replace(gpu, mem_bandwidth_gbs=round(bw, 1), driver_version=driver)
    except Exception:  # NVML missing or refused: bandwidth stays unknown (0)
        return gpu


def gpu_info(cuda_index: int | None = None, nvml: bool = True) -> GpuInfo:
    """Name, SM count, compute capability and peak memory bandwidth of one device (`nvml=False`: the CUDA
    driver's facts only, bandwidth and driver version left for `nvml_facts` to add elsewhere)."""
    idx = cuda_device_index() if cuda_index is None else cuda_index
    cu = _libcuda()
    rc = cu.cuInit(0)
    if rc != 0:
        raise Unavailable(f"cuInit failed with CUDA error {rc}")
    dev = ctypes.c_int()
    if cu.cuDeviceGet(ctypes.byref(dev), idx) != 0:
        raise Unavailable(f"no CUDA device {idx}")

    def attr(a: int) -> int:
        v = ctypes.c_int()
        cu.cuDeviceGetAttribute(ctypes.byref(v), a, dev)
        return v.value

    name = ctypes.create_string_buffer(256)
    cu.cuDeviceGetName(name, 256, dev)
    drv = ctypes.c_int()
    cu.cuDriverGetVersion(ctypes.byref(drv))
    mem = ctypes.c_size_t()
    cu.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
    bw, driver, uuid = 0.0, "", _uuid(cu, dev)
    try:
        if not nvml:
            raise Unavailable("NVML is read outside this process")
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(idx))
        bw, driver = _nvml_peak_and_driver(pynvml, h)
        uuid = str(pynvml.nvmlDeviceGetUUID(h)) or uuid
    except Exception:  # NVML missing or refused: bandwidth stays unknown (0)
        pass
    return GpuInfo(
        index=idx,
        name=name.value.decode(errors="replace"),
        sm_count=attr(_CU_ATTR_SM_COUNT),
        mem_bandwidth_gbs=round(bw, 1),
        memory_total_bytes=mem.value,
        uuid=str(uuid),
        cc=f"{attr(_CU_ATTR_CC_MAJOR)}.{attr(_CU_ATTR_CC_MINOR)}",
        driver_version=str(driver),
        cuda_driver_version=drv.value,
    )


def cupti_version() -> str:
    """The CUPTI API version of decodemon's CUPTI library once an attach has loaded it here ("" before: nothing is
    looked up in the target's own environment)."""
    lib = next(iter(getattr(sys.modules.get("decodemon.probes.native_tracer"), "_LIBS", {}).values()), None)
    if lib is None:
        return ""
    try:
        return str(int(lib.decodemon_cupti_api_version()))
    except Exception:
        return ""
