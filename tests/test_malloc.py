"""fedlib.malloc: glibc keeps freed memory, so a round's large tensor is not faulted in afresh each round."""
import os
import subprocess
import sys
import textwrap

import pytest

from fedlib import malloc

# allocate, fill and free a 64 MiB tensor (above glibc's 32 MiB mmap ceiling) twice; print the minor page faults
# of the second time: with glibc's default a fresh mmap (~16,400 4-KiB pages), with fedlib's setting none
PROBE = textwrap.dedent("""
    import resource, torch
    from fedlib.malloc import keep_freed_memory
    applied = keep_freed_memory()
    t = torch.empty(16 << 20).fill_(1.0); del t
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(16 << 20).fill_(2.0)
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
""")


def _probe(mode: str) -> tuple[str, int]:
    env = dict(os.environ, FEDLIB_MALLOC=mode, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    applied, faults = out.stdout.split()
    return applied, int(faults)


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
    assert faults < 1000, faults  # 64 MiB = 16,384 pages: almost none faulted again
    applied, faults = _probe("default")
    assert applied == "False"
    assert faults > 10000, faults  # glibc's default: a fresh mapping, every page faulted in


def test_bad_mode_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setattr(malloc, "_applied", None)
    monkeypatch.setenv("FEDLIB_MALLOC", "jemalloc")
    with pytest.raises(ValueError, match=r"FEDLIB_MALLOC='jemalloc' is not one of: reuse, default"):
        malloc.keep_freed_memory()


def test_default_mode_leaves_glibc_alone(monkeypatch):
    monkeypatch.setattr(malloc, "_applied", None)
    monkeypatch.setenv("FEDLIB_MALLOC", "default")
    assert malloc.keep_freed_memory() is False
