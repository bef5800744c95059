"""fedlib.runs.malloc: glibc keeps freed memory, so a round's large tensor is not faulted in afresh each round."""

import os
import subprocess
import sys
import textwrap

import pytest

from fedlib.runs import malloc

# allocate, fill and free a 64 MiB tensor (above glibc's 32 MiB mmap ceiling) eight times, as rounds do; print
# each time's minor page faults: with glibc's default every time a fresh mmap (~16,400 4-KiB pages); with fedlib's
# setting the first one or two extend the heap and later ones mostly reuse it (seen: [16373, 16384, 0, 16384, 0, 0,
# 0, 0] and [16372, 16384, 0, 0, 0, 0, 0, 0]; glibc's aligned allocation does not always fit the freed block)
PROBE = textwrap.dedent("""
    import resource, torch
    from fedlib.runs.malloc import keep_freed_memory
    applied = keep_freed_memory()
    faults = []
    for i in range(8):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = torch.empty(16 << 20).fill_(float(i))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        del t
    print(applied, *faults)
""")


def _probe(mode: str) -> tuple[str, list[int]]:
    env = dict(os.environ, FEDLIB_MALLOC=mode, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    applied, *faults = out.stdout.split()
    return applied, [int(f) for f in faults]


def _glibc() -> bool:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt
        return sys.platform.startswith("linux")
    except (OSError, AttributeError):
        return False


@pytest.mark.skipif(not _glibc(), reason="glibc only")
def test_freed_memory_is_reused_without_page_faults():
    applied, faults = _probe("reuse")
    assert applied == "True"
    assert sum(f < 1000 for f in faults[2:]) >= 4, faults  # most later rounds fault (almost) no page in
    applied, faults = _probe("default")
    assert applied == "False"
    assert all(f > 10000 for f in faults), faults  # glibc's default: a fresh mapping, every page faulted in


def test_bad_mode_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setattr(malloc, "_applied", None)
    monkeypatch.setenv("FEDLIB_MALLOC", "jemalloc")
    with pytest.raises(ValueError, match=r"FEDLIB_MALLOC='jemalloc' is not one of: reuse, default"):
        malloc.keep_freed_memory()


def test_default_mode_leaves_glibc_alone(monkeypatch):
    monkeypatch.setattr(malloc, "_applied", None)
    monkeypatch.setenv("FEDLIB_MALLOC", "default")
    assert malloc.keep_freed_memory() is False
