"""Run a registration right after a module is first imported.

softmax_ext registers with parts of torch that cost time to import (DTensor's
sharding propagation, Inductor's lowering and decomposition tables) without
importing them itself: when the module is already loaded the registration
runs at once, otherwise a one-shot finder on sys.meta_path runs it right
after the module's own code. A registration that fails warns and never
breaks the user's import."""

import importlib.abc
import importlib.util
import sys
import warnings
from typing import Callable


def _run(register: Callable, module, what: str) -> None:
    try:
        register(module)
    except Exception as exc:  # noqa: BLE001  (the user's import must go on)
        warnings.warn(f"softmax_ext: {what} could not be registered ({exc!r})")


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, register: Callable, what: str):
        self.name, self.register, self.what = name, register, what

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _run(self.register, module, self.what)

        spec.loader.exec_module = exec_and_register
        return spec


def after_import(name: str, register: Callable, what: str) -> None:
    """register(module) once `name` is imported (now, if it is); `what`
    names the registration in the warning a failure gives."""
    if name in sys.modules:
        _run(register, sys.modules[name], what)
    elif not any(isinstance(f, _AfterImport) and f.name == name and f.register is register for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, register, what))
