"""Benchmark cases, one module per family.

Every module in this package that defines ``cases(env) -> list[harness.Case]`` is a case
module; run.py imports them all in name order. To add cases (for example NBD copies), drop a
new module here: build your Commands (label, argv, setup, cleanup, check), optional
References and Goals, and a ``context`` that starts and stops any servers the case needs.
"""

import importlib
import pkgutil


def load(env):
    """All cases of all modules, in module-name order."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        make = getattr(module, "cases", None)
        if callable(make):
            found.extend(make(env))
    return found
