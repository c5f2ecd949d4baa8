"""Build softmax_ext._C against the torch that is already installed.

Environment knobs:
  TORCH_CUDA_ARCH_LIST  GPU targets, e.g. "9.0" (default: DEFAULT_ARCH_LIST below)
  CUDA_HOME             CUDA toolkit (default: /usr/local/cuda when it has nvcc)
  SOFTMAX_EXT_CPU_ONLY  1: build without CUDA kernels even where a toolkit exists
  SOFTMAX_EXT_DEBUG     1: -O0 -g host code, -G device code
  MAX_JOBS              parallel compile jobs (ninja)
  NVCC_THREADS          nvcc --threads (default 2)
  SOFTMAX_EXT_BUILD_DIR where compiled objects are kept between builds
                        (default: build/<flavour> in this directory)

Object files persist between builds (also for `pip install -e .`, whose own
build directory is a fresh temporary one each time): ninja then recompiles
only the sources that changed, and a rebuild of unchanged sources only links.
ccache/sccache on PATH is used by torch's ninja build when present.
"""

import glob
import os
import shlex
import subprocess
import sys
import sysconfig

from setuptools import find_packages, setup

try:
    import torch
except ImportError:
    sys.exit(
        "softmax_ext builds against the torch you already have, and none was found.\n"
        "Install torch first, then build without pip's isolated build environment:\n"
        "    pip install torch\n"
        "    pip install --no-build-isolation ."
    )


def _find_cuda_home():
    """The toolkit directory, without trusting an `nvcc` wrapper script on PATH."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        path = os.environ.get(var)
        if path and os.path.exists(os.path.join(path, "bin", "nvcc")):
            return path
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda"
    return None


CUDA_HOME = _find_cuda_home()
if CUDA_HOME:
    # torch.utils.cpp_extension reads CUDA_HOME when it is imported.
    os.environ["CUDA_HOME"] = CUDA_HOME

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

# Ampere, Hopper, Blackwell (datacenter and consumer) plus PTX for newer GPUs.
DEFAULT_ARCH_LIST = "8.0;9.0;10.0;12.0+PTX"

ROOT = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("SOFTMAX_EXT_DEBUG", "0") == "1"
WITH_CUDA = (
    torch.version.cuda is not None
    and CUDA_HOME is not None
    and os.environ.get("SOFTMAX_EXT_CPU_ONLY", "0") != "1"
)
if WITH_CUDA and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
    # torch's own default is "whatever GPU is visible now", wrong for a build
    # machine without one.
    os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH_LIST


def _archs_before_sm80(arch_list):
    """Entries of a TORCH_CUDA_ARCH_LIST older than compute capability 8.0
    (numbers such as "7.5" or "8.6+PTX", or torch's names of older GPUs)."""
    old_names = {"kepler", "kepler+tesla", "maxwell", "maxwell+tegra", "pascal", "volta", "turing"}
    found = []
    for entry in arch_list.replace(",", ";").replace(" ", ";").split(";"):
        number = entry.split("+")[0]
        try:
            if float(number) < 8.0:
                found.append(entry)
        except ValueError:
            if entry.lower() in old_names:
                found.append(entry)
    return found


def _with_sm90a(arch_list):
    """A bare "9.0" entry becomes "9.0a": the same H100/H200 machine code plus
    the sm_90a-only instructions (wgmma) of csrc/cuda/families/softmax_matmul/sm90.cu; no
    extra compile pass. "9.0+PTX" is left alone (its PTX must stay portable)."""
    entries = [e for e in arch_list.replace(",", ";").replace(" ", ";").split(";") if e]
    return ";".join("9.0a" if e == "9.0" else e for e in entries)


if WITH_CUDA:
    os.environ["TORCH_CUDA_ARCH_LIST"] = _with_sm90a(os.environ["TORCH_CUDA_ARCH_LIST"])
SM90A = WITH_CUDA and "9.0a" in os.environ["TORCH_CUDA_ARCH_LIST"].split(";")

_OLD_ARCHS = _archs_before_sm80(os.environ["TORCH_CUDA_ARCH_LIST"]) if WITH_CUDA else []
if _OLD_ARCHS:
    # The kernels use sm_80 instructions (cp.async, max.NaN.f16x2/bf16x2),
    # which ptxas would refuse for these targets with a less clear message.
    sys.exit(f"softmax_ext: TORCH_CUDA_ARCH_LIST names {_OLD_ARCHS}; "
             "the CUDA kernels need compute capability 8.0 or newer (or build without them: SOFTMAX_EXT_CPU_ONLY=1)")


def _version():
    with open(os.path.join(ROOT, "softmax_ext", "_version.py")) as f:
        scope = {}
        exec(f.read(), scope)
        return scope["__version__"]


def _libstdcxx_link_flags():
    """Link the shared C++ runtime even where only libstdc++.so.6 is installed.

    Without the libstdc++.so development link, g++ silently links libstdc++.a
    into _C; with -Bsymbolic-functions (Debian/Ubuntu Pythons) that second copy
    of the runtime then serves our own calls, and its iostreams crash against
    the process's real locale state (any error message formatting a number).
    Naming the runtime library resolves every C++ runtime symbol from it.
    """
    if not sys.platform.startswith("linux"):
        return []
    cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    try:
        found = subprocess.run(shlex.split(cxx) + ["-print-file-name=libstdc++.so"],
                               capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    if os.path.isabs(found) and os.path.exists(found):
        return []
    print(f"softmax_ext: {cxx} finds no libstdc++.so; linking libstdc++.so.6 by name", file=sys.stderr)
    return ["-l:libstdc++.so.6"]


def _sources():
    sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    if WITH_CUDA:
        sources += sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    return sources


def _extension():
    torch_version = torch.__version__.split("+")[0]
    defines = [f"-DSOFTMAX_EXT_TORCH_VERSION={torch_version}"]
    if WITH_CUDA:
        defines.append("-DSOFTMAX_EXT_WITH_CUDA")
    if SM90A:
        defines.append("-DSOFTMAX_EXT_SM90A")
    opt = ["-O0", "-g"] if DEBUG else ["-O3"]
    # -g0: Python's own compiler flags carry -g; debug info made the CPU
    # kernel objects 15 times larger and their compiles about 30% longer.
    cxx = opt + ([] if DEBUG else ["-g0"]) + defines + ["-fopenmp", "-Wall", "-Wno-unknown-pragmas"]
    nvcc = opt + defines + [
        "--expt-relaxed-constexpr",
        "-lineinfo",
        f"--threads={os.environ.get('NVCC_THREADS', '2')}",
    ]
    if DEBUG:
        nvcc.append("-G")
    kwargs = dict(
        name="softmax_ext._C",
        sources=_sources(),
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc} if WITH_CUDA else {"cxx": cxx},
        extra_link_args=["-fopenmp"] + _libstdcxx_link_flags(),
        # _C binds the ops' eager entry points to torch's Python objects
        # (csrc/python/), so it is built for one CPython, like torch itself.
        py_limited_api=False,
    )
    return CUDAExtension(**kwargs) if WITH_CUDA else CppExtension(**kwargs)


def _flavour():
    """A folder name per build configuration, so CPU-only, CUDA and debug
    builds keep their objects apart."""
    if WITH_CUDA:
        archs = os.environ["TORCH_CUDA_ARCH_LIST"]
        tag = "cuda-" + "".join(c if c.isalnum() else "_" for c in archs)
    else:
        tag = "cpu"
    torch_tag = torch.__version__.split("+")[0]
    return f"temp-torch{torch_tag}-{tag}" + ("-debug" if DEBUG else "")


class PersistentBuildExtension(BuildExtension):
    """build_ext with a build directory that outlives the build.

    setuptools gives every `pip install -e .` a fresh temporary build_temp, so
    each install recompiled every source. Unless build_temp is named on the
    command line (`-t`), objects go to SOFTMAX_EXT_BUILD_DIR or
    build/<flavour>/ beside setup.py, where ninja finds them up to date next
    time. ninja's own progress lines ([N/M] per compile step) reach the
    console with `pip install -v` (pip hides build output otherwise)."""

    def finalize_options(self):
        explicit = "build_temp" in self.distribution.get_option_dict("build_ext")
        super().finalize_options()
        if not explicit:
            base = os.environ.get("SOFTMAX_EXT_BUILD_DIR") or os.path.join(ROOT, "build")
            self.build_temp = os.path.join(base, _flavour())

    def build_extensions(self):
        n = len(self.extensions[0].sources) if self.extensions else 0
        print(f"softmax_ext: compiling {n} sources in {self.build_temp} (ninja reuses the objects of "
              f"unchanged sources; progress as [step/total] lines)", file=sys.stderr, flush=True)
        super().build_extensions()


print(
    f"softmax_ext: building against torch {torch.__version__}, "
    + (f"CUDA kernels for TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']} "
       f"(toolkit {CUDA_HOME})" if WITH_CUDA else "CPU kernels only"),
    file=sys.stderr,
)

setup(
    name="softmax_ext",
    version=_version(),
    description="Softmax, log_softmax and their backward passes as compiled PyTorch custom ops (CPU and CUDA)",
    long_description=open(os.path.join(ROOT, "README.md")).read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["softmax_ext", "softmax_ext.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": PersistentBuildExtension},
    python_requires=">=3.9",
    # numpy: not used by softmax_ext, but torch warns "Failed to initialize
    # NumPy" at import wherever it is missing (torch does not require it).
    install_requires=["torch", "numpy"],
)
