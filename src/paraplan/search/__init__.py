"""Search the plan space and rank plans.

The package is also the Python API's search: `paraplan.search(...)` calls paraplan/api.py
search (a package attribute of the same name could not be a function: importing this package
makes `paraplan.search` the package)."""

import sys
import types


class _SearchPackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        """paraplan.api.search: rank every valid plan that fits."""
        from ..api import search
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _SearchPackage
