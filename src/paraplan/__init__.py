"""paraplan: predict, search and rank parallel training plans for transformers.

From Python (paraplan/api.py, whose docstring is a runnable example):

    import paraplan
    best = paraplan.search("llama3-70b", "dgx-h100", gpus=512).ranked[0]
    est = paraplan.estimate("llama3-70b", gpus=512, tp=8, pp=4, recompute="selective")
    served = paraplan.serve("llama3-70b", gpus=8, rate_rps=8.0)

`paraplan.api` holds these and `embeddings` and `validate`. `import paraplan` imports
nothing else: each function loads what it needs when called.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["estimate", "search", "serve", "__version__"]


def __getattr__(name: str):
    """paraplan.search, .estimate and .serve, imported when first used (PEP 562). By name
    (importlib): the package's modules read it (`from paraplan import units`), while this hook
    runs only after it is whole, so it is no import edge of its own."""
    import importlib
    if name == "search":  # the subpackage, callable as the API's search (search/__init__.py)
        return importlib.import_module(".search", __name__)
    if name in ("estimate", "serve"):
        return getattr(importlib.import_module(".api", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
