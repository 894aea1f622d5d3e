"""DSL layer: a declaration of the user's own, named as ``module:attribute`` or
``path/to/file.py:attribute``, for the command line and anything else that takes a variant by name."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from ..declaration import Declaration
from ..errors import DeclarationError


def load_declaration(spec: str) -> Declaration:
    """The declaration ``spec`` names: ``module:attribute`` (an importable module) or
    ``path/to/file.py:attribute`` (a file, run as a module of its own), where the attribute is a
    ``Declaration`` or a Python function of no arguments that returns one."""
    where, _, attribute = spec.rpartition(":")
    if not where or not attribute:
        raise DeclarationError(f"variant: {spec!r}; name a declaration as module:attribute or path/to/file.py:attribute")
    module = _module(where, spec)
    if not hasattr(module, attribute):
        raise DeclarationError(f"variant: {spec!r}: {where} has no attribute {attribute!r}")
    value = getattr(module, attribute)
    if inspect.isfunction(value):
        if not _takes_no_arguments(value):
            raise DeclarationError(f"variant: {spec!r} needs arguments; name a Declaration or a function of no "
                                   "arguments that returns one")
        value = _run(spec, f"{attribute}()", value)
    if not isinstance(value, Declaration):
        raise DeclarationError(f"variant: {spec!r} is a {type(value).__name__}, not a Declaration (build one with "
                               "Recurrence(...).build(...), or name a function of no arguments that returns one)")
    return value


def _module(where: str, spec: str):
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise DeclarationError(f"variant: {spec!r}: no file {where}")
        # one module per file (two files of one name do not replace each other)
        name = f"replayssm_user_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module  # (dataclasses and pickling look a module up by name)
        try:
            _run(spec, where, loader.loader.exec_module, module)
        except DeclarationError:
            del sys.modules[name]
            raise
        return module
    try:
        return _run(spec, where, importlib.import_module, where)
    except DeclarationError as exc:
        cause = exc.__cause__
        if isinstance(cause, ModuleNotFoundError) and cause.name == where.split(".")[0]:
            raise DeclarationError(f"variant: {spec!r}: no module {where!r}") from None
        raise


def _run(spec: str, what: str, function, *args):
    """``function(*args)``: the user's code, whose failure is reported as the variant's."""
    try:
        return function(*args)
    except DeclarationError:
        raise
    except Exception as exc:
        raise DeclarationError(f"variant: {spec!r}: {what} raised {type(exc).__name__}: {exc}") from exc


def _takes_no_arguments(function) -> bool:
    parameters = inspect.signature(function).parameters.values()
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters)
