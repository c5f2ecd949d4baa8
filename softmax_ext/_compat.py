"""The torch version check at import: softmax_ext._C is compiled against one
torch's headers and ABI, and is only loaded by a torch of the same
major.minor. A mismatch is reported naming both versions and the fix, before
(or instead of) the loader's undefined-symbol message."""

import glob
import mmap
import os
import re

import torch

_TAG = b"softmax_ext built against torch "


def major_minor(version: str):
    """(major, minor) of a torch version string such as "2.14.1+cu130" or
    "2.15.0a0+git1234"; None when it does not start with two numbers."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def mismatch_message(built: str, running: str) -> str:
    return (
        f"softmax_ext: the compiled extension softmax_ext._C was built against torch {built}, "
        f"but torch {running} is running; an extension only loads into the torch major.minor it was "
        f"compiled for. Rebuild it against this torch (from the source checkout: "
        f"pip install --no-build-isolation --no-deps --force-reinstall -e . , or without -e for a "
        f"site-packages install), or install torch=={built}."
    )


def check_torch_version(built: str, running: str = None) -> None:
    """Raises ImportError when `built` and the running torch (or `running`)
    differ in major.minor. Unparsable versions pass."""
    running = torch.__version__ if running is None else running
    b, r = major_minor(built), major_minor(running)
    if b is not None and r is not None and b != r:
        raise ImportError(mismatch_message(built, running))


def built_version_from_binary(package_dir: str):
    """The torch version written into the _C binary of `package_dir`
    (csrc/build_tag.cpp), read from the file without loading it; None when
    no _C file or no tag is found."""
    for path in sorted(glob.glob(os.path.join(package_dir, "_C*.so")) +
                       glob.glob(os.path.join(package_dir, "_C*.pyd"))):
        try:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                at = data.find(_TAG)
                if at < 0:
                    continue
                end = data.find(b";", at, at + 200)
                return data[at + len(_TAG):end].decode("ascii", "replace") if end > 0 else None
        except (OSError, ValueError):
            continue
    return None
