"""Benchmark cases, one module per family.

Every module in this package that defines ``cases(env) -> list[harness.Case]`` is a case
module; run.py imports them all in name order. To add cases (for example NBD copies), drop a
new module here: build your Commands (label, argv, setup, cleanup, check), optional
References and Goals, and a ``context`` that starts and stops any servers the case needs.
"""

import importlib
import pkgutil


def load(env, only=()):
    """All cases of all modules, in module-name order. With ONLY (texts a case name must
    contain one of), a module none of whose cases match is listed dry and skipped, so
    that running one case does not make every other module's images."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        make = getattr(module, "cases", None)
        if not callable(make):
            continue
        if only and not env.dry:
            env.dry = True
            try:
                names = [c.name for c in make(env)]
            finally:
                env.dry = False
            if not any(t in n for n in names for t in only):
                continue
        found.extend(make(env))
    return found
