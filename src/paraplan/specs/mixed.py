"""A cluster of several GPU groups: each a homogeneous cluster of its own (GPU, node shape,
networks), joined by a link between groups.

Teams rarely own one uniform fleet: 512 H100 beside 512 A100, H200 racks beside B200 ones.
A mixed cluster names each group by a cluster preset (or TOML) and its GPU count, and the
network a GPU of one group reaches a GPU of another by (`between_groups`: per GPU, one way,
in the cluster tier schema). Plans over it place pipeline stages on groups (plan/mixed.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SpecError
from .hardware import ClusterSpec, LinkTier


@dataclass(frozen=True, kw_only=True)
class GPUGroup:
    """One homogeneous group: its name and its cluster, sized to the group's GPUs."""

    name: str
    cluster: ClusterSpec

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus


@dataclass(frozen=True, kw_only=True)
class MixedCluster:
    """GPU groups and the link between them (a GPU of one group to a GPU of another)."""

    name: str
    groups: tuple[GPUGroup, ...]
    between_groups: LinkTier
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"mixed cluster {self.name!r}"
        if len(self.groups) < 2:
            raise SpecError(where, "group", len(self.groups), "at least two [[group]] tables")
        names = [g.name for g in self.groups]
        for name in names:
            if names.count(name) > 1:
                raise SpecError(where, "group.name", name, "a name used by one group only")

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.groups)

    def group(self, name: str) -> GPUGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise SpecError(f"mixed cluster {self.name!r}", "group", name,
                        f"one of its groups ({', '.join(g.name for g in self.groups)})")
