"""A capture worker's process: its allocator keeps the memory a produced transaction
frees, instead of faulting it in again for the next one (no servers)."""

import os
import platform
import subprocess
import sys

import pytest

ROWS = 50_000

# Feeds an assembler 50 transactions of 1,000 rows twice, and prints the page faults
# of the second time, the heap having reached its peak in the first. The rows take the
# general path (dictionaries for every row): the compiled encoder allocates too little
# for its heap to show the difference, but the rows it leaves to the general path (and
# a build without it) run this way.
#
# The untuned process is given glibc's initial thresholds (128 KiB each) explicitly:
# glibc raises both for good once a mapped block of more is freed, so without them
# whether it trims at all depends on what the interpreter's start happened to free.
_FEED = """
import ctypes, resource, struct, sys
from gpcdc_toolkit.capture import tune_for_capture
from gpcdc_toolkit.protocol import TransactionAssembler, _assembler

_assembler._encode_tuple = None
if sys.argv[1] == "tuned":
    tune_for_capture()
else:
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    ctypes.CDLL(None).mallopt(M_TRIM_THRESHOLD, 128 * 1024)

def text(s):
    return s.encode() + b"\\0"

def value(v):
    return b"t" + struct.pack(">I", len(v)) + v

relation = (b"R" + struct.pack(">I", 16400) + text("public") + text("rows") + b"d" + struct.pack(">h", 2)
            + b"\\1" + text("id") + struct.pack(">Ii", 20, -1) + b"\\0" + text("v") + struct.pack(">Ii", 25, -1))
payloads = [relation]
for t in range(ROWS // 1000):
    lsn = 1_000_000 * (t + 1)
    payloads.append(b"B" + struct.pack(">QqI", lsn, 0, 1000 + t))
    payloads += [b"I" + struct.pack(">I", 16400) + b"N" + struct.pack(">h", 2) + value(str(t * 1000 + i).encode())
                 + value(b"x" * 40) for i in range(1000)]
    payloads.append(b"C" + struct.pack(">BQQq", 0, lsn, lsn + 50, 0))

def feed():
    assembler = TransactionAssembler(0, source_name="p", database="db", max_buffered=1000)
    produced = sum(len(assembler.feed(p)) for p in payloads)
    assert produced == ROWS + 2 * (ROWS // 1000), produced

feed()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
feed()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""".replace("ROWS", str(ROWS))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's allocator, which this Python does not use")
def test_a_process_tuned_for_capture_does_not_fault_its_heap_in_again_for_each_transaction():
    # glibc's allocator as it comes: none of its settings from the environment, no other allocator preloaded
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))}
    faults = {mode: int(subprocess.run([sys.executable, "-c", _FEED, mode], capture_output=True, text=True,
                                       check=True, env=env).stdout) for mode in ("tuned", "default")}
    assert faults["default"] > ROWS // 10, f"glibc's initial thresholds fault the heap in again: {faults}"
    assert faults["tuned"] < ROWS // 100, faults
