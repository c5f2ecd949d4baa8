"""Compare the machine code (SASS) of every kernel in two builds of _C.

    python scripts/compare_kernels.py BEFORE.so AFTER.so [--show NAME]

Disassembles both libraries with cuobjdump -sass (CUDA_HOME/bin, or the copy
Triton ships) and compares each kernel's instructions per GPU architecture.
Instructions are compared with their encodings, white space folded
(cuobjdump pads each file's listing to its longest line). Kernels are
matched by symbol, with names made comparable first: anonymous
namespaces carry their file's name and a hash (_GLOBAL__N__<hash>_<n>_<file>),
which moving a file changes. A symbol found in several object files is
compared as the set of its bodies. Prints the identical and differing
kernels and those present on one side only (matched again by body, to tell
a renamed kernel from a new one); exits 1 where anything differs.
"""

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys

ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_[A-Za-z0-9_]*?_[0-9a-f]{8}(?=\d)")
ADDRESS = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*")


def cuobjdump():
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"),
                  shutil.which("cuobjdump") or ""]
    try:
        import triton

        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except ImportError:
        pass
    candidates += glob.glob("/usr/local/cuda*/bin/cuobjdump")
    for c in candidates:
        if c and os.path.exists(c):
            return c
    sys.exit("cuobjdump not found (set CUDA_HOME or install triton)")


def normalise(name):
    return ANON.sub("ANON", name)


def kernels(path):
    """{(arch, name): [body, ...]} of a library or object file."""
    text = subprocess.run([cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout
    found = collections.defaultdict(list)
    arch, name, body = None, None, []

    def close():
        if name is not None:
            found[(arch, name)].append("\n".join(body))

    for line in text.splitlines():
        if line.startswith("arch = "):
            close()
            name, body = None, []
            arch = line.split("=", 1)[1].strip()
        elif "Function : " in line:
            close()
            name, body = normalise(line.split("Function : ", 1)[1].strip()), []
        elif name is not None and line.strip().startswith("/*") and ";" in line:
            # the instruction and its encoding: /*0040*/  @!P0 BRA 0x210 ;  /* 0x... */
            body.append(" ".join(ANON.sub("ANON", ADDRESS.sub("", line)).split()))
        elif name is not None and re.match(r"^\s+/\* 0x[0-9a-f]{16} \*/\s*$", line):
            body.append(line.strip())  # the second half of an encoding
    close()
    return {k: sorted(v) for k, v in found.items()}


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--show", help="print the differing SASS of kernels whose demangled name contains this")
    ap.add_argument("--quiet", action="store_true", help="counts and differing kernels only")
    args = ap.parse_args()
    before, after = kernels(args.before), kernels(args.after)
    same = [k for k in before if k in after and before[k] == after[k]]
    differ = [k for k in before if k in after and before[k] != after[k]]
    only_before = [k for k in before if k not in after]
    only_after = [k for k in after if k not in before]
    # one-sided names matched by body: renamed kernels with identical code
    bodies_after = collections.defaultdict(list)
    for k in only_after:
        bodies_after[(k[0], tuple(after[k]))].append(k)
    renamed = []
    for k in list(only_before):
        match = bodies_after.get((k[0], tuple(before[k])))
        if match:
            other = match.pop(0)
            renamed.append((k, other))
            only_before.remove(k)
            only_after.remove(other)

    archs = sorted({k[0] for k in before} | {k[0] for k in after})
    print(f"{args.before}: {len(before)} kernels; {args.after}: {len(after)} kernels; archs {', '.join(archs)}")
    print(f"identical: {len(same)}; renamed with identical code: {len(renamed)}; differing: {len(differ)}; "
          f"only before: {len(only_before)}; only after: {len(only_after)}")
    for title, keys in (("differing", differ), ("only before", only_before), ("only after", only_after)):
        if keys:
            print(f"\n{title}:")
            for (arch, _), pretty in zip(keys, demangle([k[1] for k in keys])):
                print(f"  [{arch}] {pretty}")
    if renamed and not args.quiet:
        print("\nrenamed with identical code:")
        for (a, b) in renamed:
            pa, pb = demangle([a[1], b[1]])
            print(f"  [{a[0]}] {pa}\n      -> {pb}")
    if args.show:
        import difflib

        for k in differ:
            if args.show in demangle([k[1]])[0]:
                b, a = "\n\n".join(before[k]).splitlines(), "\n\n".join(after[k]).splitlines()
                print("\n".join(difflib.unified_diff(b, a, "before", "after", lineterm="", n=1)))
    return 1 if differ or only_before or only_after else 0


if __name__ == "__main__":
    sys.exit(main())
