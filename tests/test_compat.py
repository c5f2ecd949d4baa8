"""The torch version check at import (softmax_ext/_compat.py): a _C built for
another torch major.minor is refused with both versions and the fix named."""

import os
import subprocess
import sys

import pytest
import torch

from softmax_ext import _compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("version, expected", [
    ("2.14.1+cu130", (2, 14)), ("2.15.0a0+git1234", (2, 15)), ("10.2", (10, 2)), ("nightly", None),
])
def test_major_minor(version, expected):
    assert _compat.major_minor(version) == expected


@pytest.mark.parametrize("built, running", [("2.14.1", "2.14.0+cu130"), ("2.14.1", "2.14.2"), ("2.14.1", "dev")])
def test_same_major_minor_passes(built, running):
    _compat.check_torch_version(built, running)


@pytest.mark.parametrize("built, running", [("2.14.1", "2.11.0+cu130"), ("2.11.0", "2.14.1"), ("2.14.1", "3.14.1")])
def test_other_major_minor_names_both_and_the_fix(built, running):
    with pytest.raises(ImportError) as info:
        _compat.check_torch_version(built, running)
    message = str(info.value)
    assert f"built against torch {built}" in message and f"torch {running} is running" in message
    assert "pip install --no-build-isolation" in message and f"torch=={built}" in message


def test_binary_names_the_torch_it_was_built_against(sx):
    package_dir = os.path.dirname(sx.__file__)
    assert _compat.built_version_from_binary(package_dir) == sx.build_info()["torch"]
    assert _compat.major_minor(sx.build_info()["torch"]) == _compat.major_minor(torch.__version__)


def test_binary_without_a_tag(tmp_path):
    assert _compat.built_version_from_binary(str(tmp_path)) is None
    (tmp_path / "_C.abi3.so").write_bytes(b"\x7fELF no tag here")
    assert _compat.built_version_from_binary(str(tmp_path)) is None


def _import_with(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_import_under_another_torch_fails_clearly():
    # The running torch reports another version: the import must stop with
    # the version message, not load the ops.
    result = _import_with("import torch; torch.__version__ = '1.99.0'; import softmax_ext")
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "torch 1.99.0 is running" in result.stderr
    assert "built against torch" in result.stderr


def test_load_failure_reports_the_built_version():
    # _C that cannot load (as with undefined symbols of another torch): the
    # version read from the file is compared before the loader's message.
    code = (
        "import builtins, torch\n"
        "real = builtins.__import__\n"
        "def fake(name, globals=None, locals=None, fromlist=(), level=0):\n"
        "    if fromlist and '_C' in fromlist and globals and globals.get('__name__') == 'softmax_ext':\n"
        "        raise ImportError('undefined symbol: _ZN3c10xyz')\n"
        "    return real(name, globals, locals, fromlist, level)\n"
        "builtins.__import__ = fake\n"
        "torch.__version__ = '1.99.0'\n"
        "import softmax_ext\n"
    )
    result = _import_with(code)
    assert result.returncode != 0
    assert "torch 1.99.0 is running" in result.stderr, result.stderr[-2000:]
