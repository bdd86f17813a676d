"""fleetlens.heap: freed big blocks are reused, not faulted in again."""

from __future__ import annotations

import subprocess
import sys

_FAULTS = """
import resource, sys
import numpy as np
from fleetlens.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults_of_one_window():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(8_000_000)  # 64 MB, over glibc's largest adaptive mmap threshold
    del a
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_window()
print(min(faults_of_one_window() for _ in range(3)))
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_a_freed_block_is_reused_by_the_next_window() -> None:
    assert _faults("default") >= 32  # 64 MB in pages of 4 KiB or 2 MiB: mapped anew each time
    assert _faults("keep") < 8
