"""The one registry of training-engine exporters: an engine (specs/engine.py) to the module
that writes its config (export/common.py Exporter). Each module is imported when asked for."""

from __future__ import annotations

from ..specs.engine import Engine, EngineSupport
from .common import Exporter


def exporter(engine: Engine | str) -> Exporter:
    """The export module of `engine` (its ENGINE, SUPPORT, check and export)."""
    engine = Engine(engine)
    if engine is Engine.TORCHTITAN:
        from . import torchtitan as mod
    elif engine is Engine.MEGATRON:
        from . import megatron as mod
    else:
        from . import deepspeed as mod
    return mod  # type: ignore[return-value]  (a module follows the protocol structurally)


def engine_support(engine: Engine | str, no_compile: bool = False) -> EngineSupport:
    """The engine's bounds and policy; with `no_compile` (--no-compile) its blocks run eager."""
    support = exporter(engine).SUPPORT
    return support.without_compile() if no_compile else support
