"""The engines as an input (specs/engine.py) and the one registry of their exporters
(export/registry.py): every engine has an exporter that follows export/common.py Exporter."""

from __future__ import annotations

import inspect

import pytest

from paraplan.export.common import Exporter
from paraplan.export.registry import engine_support, exporter
from paraplan.specs.engine import Engine, EngineSupport


@pytest.mark.parametrize("engine", list(Engine))
def test_every_engine_has_an_exporter_that_follows_the_protocol(engine):
    mod = exporter(engine)
    assert mod.ENGINE is engine and isinstance(mod.SUPPORT, EngineSupport) and mod.SUPPORT.engine is engine
    for name in ("check", "export"):
        wanted = list(inspect.signature(getattr(Exporter, name)).parameters)[1:]  # without self
        assert list(inspect.signature(getattr(mod, name)).parameters) == wanted, name


def test_the_registry_takes_names_and_no_compile_only_where_the_engine_compiles():
    assert exporter("megatron") is exporter(Engine.MEGATRON)
    eager = engine_support("torchtitan", no_compile=True)
    assert not eager.compiled and not eager.compiled_loss and eager.limits.tp_overlap == (False,)
    assert engine_support("torchtitan").compiled_loss  # torchtitan compiles its loss with the blocks
    with pytest.raises(Exception, match="--no-compile"):
        engine_support("megatron", no_compile=True)
