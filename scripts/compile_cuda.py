"""Compile some CUDA sources of csrc/ on their own, with setup.py's flags, for
one GPU target: a quick check (errors, registers, spills) without building the
whole extension. No GPU needed.

    python scripts/compile_cuda.py csrc/cuda/families/warp/forward.cu [more.cu ...]
    ARCH=90a python scripts/compile_cuda.py ...   (default 90)

Objects go to a temporary folder and are thrown away, or to KEEP=DIR (for
`python scripts/compare_kernels.py DIR1/x.o DIR2/x.o`); ptxas's resource
report (-Xptxas -v) is printed when VERBOSE=1.
"""

import os
import subprocess
import sys
import sysconfig
import tempfile

os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")  # read by cpp_extension at import
import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(files):
    cuda_home = os.environ["CUDA_HOME"]
    arch = os.environ.get("ARCH", "90")
    includes = [os.path.join(ROOT, "csrc"), sysconfig.get_paths()["include"]]
    includes += cpp_extension.include_paths(device_type="cuda")
    torch_version = torch.__version__.split("+")[0]
    flags = [
        os.path.join(cuda_home, "bin", "nvcc"), "-c", "-std=c++20", "-O3", "--expt-relaxed-constexpr",
        "-lineinfo", f"-DSOFTMAX_EXT_TORCH_VERSION={torch_version}", "-DSOFTMAX_EXT_WITH_CUDA",
        "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
        "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
        "-DTORCH_EXTENSION_NAME=_C", "-D_GLIBCXX_USE_CXX11_ABI=1", "-Xcompiler", "-fPIC",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
    ] + [f"-I{p}" for p in includes]
    if os.environ.get("VERBOSE") == "1":
        flags += ["-Xptxas", "-v"]
    failed = 0
    keep = os.environ.get("KEEP")
    if keep:
        os.makedirs(keep, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            out = os.path.join(keep or tmp, os.path.basename(f) + ".o")
            print(f"== {f}", flush=True)
            failed += subprocess.run(flags + [f, "-o", out]).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
