"""What this machine offers the executors and the planner: the memory available (``available_bytes``), the cores
this process may use (``cores``), the size of each cache level (``cache_bytes``: the stacked executor sizes its client
groups to it), and the CPU's name (recorded with every run).
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

import torch

# (input shape, samples in the whole data set) per data set; Synthetic is generated per client (sizes below)


def available_bytes(device: str = "cpu") -> int | None:
    """What a run may use: free GPU memory on CUDA, else MemAvailable (Linux) or physical memory; None if unknown."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cores(cgroup: str = "/sys/fs/cgroup") -> int:
    """The CPUs this process may keep busy: the cores it may run on (``os.sched_getaffinity``), fewer where a cgroup
    quota caps its CPU time (a container started with ``--cpus 2`` on a 64-core host sees 64 cores; cgroup v2
    ``cpu.max``, v1 ``cpu/cpu.cfs_quota_us``), rounded up; at least 1."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            fields = Path(cgroup, quota_file).read_text().split()
            if period_file is not None:
                fields.append(Path(cgroup, period_file).read_text().strip())
            quota, period = float(fields[0]), float(fields[1])  # "max 100000" (no quota) fails here
        except (OSError, ValueError, IndexError):
            continue
        if quota > 0 and period > 0:
            n = min(n, math.ceil(quota / period))
    return max(1, n)


def cache_bytes(level: int, root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size in bytes of the first CPU's level-``level`` data cache (a unified or data one; the largest if sysfs
    lists several), as Linux's sysfs reports it ("2048K"); None where it does not (another OS, a level the CPU
    lacks, an unreadable entry). ``root``: that folder, for tests."""
    sizes = []
    for entry in Path(root).glob("index*") if Path(root).is_dir() else ():
        try:
            if int((entry / "level").read_text()) != level or (entry / "type").read_text().strip() == "Instruction":
                continue
            text = (entry / "size").read_text().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


# the vector instructions float32 kernels (MKL, oneDNN) dispatch on, widest first, as /proc/cpuinfo's flags name them
VECTOR_ISAS = (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"), ("sve", "sve"), ("asimd", "neon"))


def cpu_name(cpuinfo: str | None = None) -> str:
    """This machine's CPU as a run's meta.json records it (``device_name``): the model and the widest vector
    instructions its float32 kernels dispatch on, e.g. "<the model name>, avx2". Two CPUs that differ in these sum a
    matmul or convolution in another order, so a run trained again repeats its stored numbers to the last bit only on
    the same kind (``fedlib.experiments.verify``). From /proc/cpuinfo (``cpuinfo``: its text, for tests), else ``platform``'s
    processor or machine name (older stored runs have only that, e.g. "x86_64")."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    model = fields.get("model name") or platform.processor() or platform.machine()
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    isa = next((name for flag, name in VECTOR_ISAS if flag in flags), None)
    return f"{model}, {isa}" if isa else model
