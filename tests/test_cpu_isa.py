"""The CPU kernels are built once per instruction set (csrc/cpu/isa.h: a
baseline build, AVX2 and AVX-512) and the widest one the CPU runs is taken,
capped by ATEN_CPU_CAPABILITY as torch's own kernels are. The rest of the
suite runs the widest; this reruns the CPU value tests of the row kernels
(every dtype, short and partial rows, middle axes, backward) in a fresh
process under each narrower level."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
NARROWER = {"AVX512": ["avx2", "default"], "AVX2": ["default"]}.get(torch.backends.cpu.get_cpu_capability(), [])
SELECTED = [
    "test_forward.py::test_short_rows_every_length",
    "test_forward.py::test_rows_of_one_vector_or_less",
    "test_forward.py::test_axis_lengths_last_dim",
    "test_forward.py::test_axis_lengths_middle_dim",
    "test_backward.py",
    "test_layouts.py",
]


@pytest.mark.skipif(not NARROWER, reason="no narrower CPU capability than the one in use")
@pytest.mark.parametrize("capability", NARROWER or ["none"])
def test_cpu_kernels_of_each_isa(capability):
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", "-k", "cpu",
           *[str(TESTS / s) for s in SELECTED]]
    run = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
