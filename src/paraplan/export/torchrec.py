"""TorchRec bridge: export an embedding plan as `ParameterConstraints`, run TorchRec's own
planner, and price any plan with TorchRec's own cost model (its EmbeddingPerfEstimator and
NoopPerfModel: the max over ranks of each rank's summed shard costs).

TorchRec is optional (CPU install in the README); `parameter_constraints` needs nothing.
TorchRec's estimator works in milliseconds (its bandwidths are bytes/ms); results here are
seconds. Both planners see the same hardware: the cluster spec's HBM, host-link, NVLink and
per-GPU network bandwidths are handed to TorchRec's Topology.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..embeddings.cost import ComputeKernel, EmbeddingPlan, ShardingType, TablePlacement
from ..embeddings.tables import EmbeddingWorkload
from ..errors import ParaplanError
from ..specs.hardware import ClusterSpec

MS_PER_S = 1000.0
TABLE_PREFIX = "t_"  # TorchRec table names; features keep the workload's names


def parameter_constraints(plan: EmbeddingPlan, wl: EmbeddingWorkload) -> dict:
    """The plan as TorchRec `ParameterConstraints` keyword arguments per table (JSON-ready):
    `ParameterConstraints(**v)` takes each, once `cache_params` is made `CacheParams(**...)`
    (`load_constraints` does both). Constraints fix sharding type, kernel and column split,
    not ranks: `placement` says where paraplan puts each shard."""
    tables = {t.name: t for t in wl.tables}
    out = {}
    for p in plan.placements:
        t = tables[p.table]
        c = {"sharding_types": [p.sharding.value], "compute_kernels": [p.kernel.value],
             "pooling_factors": [t.pooling_factor]}
        if p.sharding is ShardingType.COLUMN_WISE:
            c["min_partition"] = t.dim // len(p.ranks)
        if p.kernel is ComputeKernel.UVM_CACHING:
            c["cache_params"] = {"load_factor": p.cache_ratio}
        out[TABLE_PREFIX + p.table] = c
    return out


def placement(plan: EmbeddingPlan) -> dict:
    """Per table, paraplan's ranks in shard order (column and table-row-wise shards), with its
    sharding type, kernel and replicated hot-row share: what TorchRec's constraints cannot pin."""
    return {TABLE_PREFIX + p.table: {"sharding_type": p.sharding.value, "compute_kernel": p.kernel.value,
                                     "ranks": list(p.ranks), "cache_ratio": p.cache_ratio,
                                     "hot_row_fraction": p.hot_row_fraction}
            for p in plan.placements}


def export_document(plan: EmbeddingPlan, wl: EmbeddingWorkload) -> dict:
    """What `paraplan embeddings --export-torchrec` writes: TorchRec table names (the
    workload's names prefixed `t_`, as TorchRec's DLRM examples name them; features keep
    the workload's names), their ParameterConstraints and paraplan's placement."""
    return {"world_size": plan.world_size, "table_name_prefix": TABLE_PREFIX,
            "parameter_constraints": parameter_constraints(plan, wl), "placement": placement(plan)}


def load_constraints(document: dict) -> dict:
    """TorchRec `ParameterConstraints` objects from an exported document (needs TorchRec)."""
    _torchrec()
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams
    out = {}
    for name, fields in document["parameter_constraints"].items():
        c = dict(fields)
        if "cache_params" in c:
            c["cache_params"] = CacheParams(**c["cache_params"])
        out[name] = ParameterConstraints(**c)
    return out


def _torchrec():
    try:
        import torch  # noqa: F401
        import torchrec  # noqa: F401
        from torchrec.distributed.planner import EmbeddingShardingPlanner  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA fbgemm failing to load on CPU
        raise ParaplanError(f"TorchRec is not usable here ({type(exc).__name__}: {exc}); install the CPU build as the "
                            "README's 'Side by side with TorchRec' section shows") from None


def topology(cluster: ClusterSpec, world_size: int):
    """TorchRec's Topology for `world_size` GPUs of `cluster` (bandwidths in bytes/ms)."""
    _torchrec()
    from torchrec.distributed.planner import Topology
    gpu = cluster.gpu
    return Topology(world_size=world_size, compute_device="cuda", local_world_size=min(cluster.gpus_per_node, world_size),
                    hbm_cap=int(gpu.hbm_bytes), hbm_mem_bw=gpu.hbm_bw_bytes_per_s / MS_PER_S,
                    hbm_to_ddr_mem_bw=gpu.host_link_bw_unidir_bytes_per_s / MS_PER_S,
                    intra_host_bw=cluster.nvlink.bw_unidir_bytes_per_s / MS_PER_S,
                    inter_host_bw=cluster.scaleout.bw_unidir_bytes_per_s / MS_PER_S)


def _module(wl: EmbeddingWorkload):
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    tables = [EmbeddingBagConfig(name=TABLE_PREFIX + t.name, embedding_dim=t.dim, num_embeddings=t.num_rows,
                                 feature_names=[t.name]) for t in wl.tables]
    return EmbeddingBagCollection(tables=tables, device=torch.device("meta"))


def _constraints(wl: EmbeddingWorkload, plan: EmbeddingPlan | None):
    fields = parameter_constraints(plan, wl) if plan is not None else {}
    return load_constraints({"parameter_constraints": {
        TABLE_PREFIX + t.name: fields.get(TABLE_PREFIX + t.name, {"pooling_factors": [t.pooling_factor]})
        for t in wl.tables}})


def _quiet():
    import logging
    import warnings
    warnings.filterwarnings("ignore", module="torchrec")
    logging.getLogger("torchrec").setLevel(logging.ERROR)


@dataclass(frozen=True, kw_only=True)
class TorchRecPricing:
    max_rank_s: float      # TorchRec's plan rating: the slowest rank's summed shard costs
    max_rank_hbm_bytes: float
    hbm_cap_bytes: float


def _rate(options, topo) -> TorchRecPricing:
    from torchrec.distributed.planner.perf_models import NoopPerfModel, NoopStorageModel
    return TorchRecPricing(max_rank_s=NoopPerfModel(topo).rate(options) / MS_PER_S,
                           max_rank_hbm_bytes=float(NoopStorageModel(topo).rate(options)),
                           hbm_cap_bytes=float(topo.devices[0].storage.hbm))


def price_with_torchrec(plan: EmbeddingPlan, wl: EmbeddingWorkload, cluster: ClusterSpec) -> TorchRecPricing:
    """Price paraplan's plan with TorchRec's estimator: each table forced to the plan's
    sharding type, kernel and column split through ParameterConstraints, shards on the
    plan's ranks."""
    _torchrec()
    _quiet()
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    topo = topology(cluster, plan.world_size)
    enum = EmbeddingEnumerator(topology=topo, batch_size=wl.batch_size_per_rank, constraints=_constraints(wl, plan))
    options = enum.enumerate(_module(wl), [EmbeddingBagCollectionSharder()])
    chosen = []
    for p in plan.placements:
        opts = [o for o in options if o.name == TABLE_PREFIX + p.table and o.sharding_type == p.sharding.value
                and o.compute_kernel == p.kernel.value and len(o.shards) == len(p.ranks)]
        if not opts:
            raise ParaplanError(f"TorchRec cannot express table {p.table!r} as {p.sharding.value} "
                                f"with {len(p.ranks)} shards on {p.kernel.value}")
        o = opts[0]
        for shard, rank in zip(o.shards, p.ranks):
            shard.rank = rank
        chosen.append(o)
    return _rate(chosen, topo)


def _uvm_caching_ratio() -> float:
    from torchrec.distributed.planner.constants import UVM_CACHING_RATIO
    return float(UVM_CACHING_RATIO)


PROPOSERS = ("default", "search")


def torchrec_plan(wl: EmbeddingWorkload, cluster: ClusterSpec, world_size: int, proposers: str = "default"):
    """TorchRec's planner on the same workload and hardware: (plan, its own rating).

    `default`: EmbeddingShardingPlanner's proposers (grid search when the space is small,
    greedy, uniform). `search`: adds its slower ones, the dynamic-programming proposer and a
    grid search allowed 10× more proposals."""
    if proposers not in PROPOSERS:
        raise ParaplanError(f"proposers={proposers!r} is not allowed; allowed: {', '.join(PROPOSERS)}")
    _torchrec()
    _quiet()
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.proposers import (DynamicProgrammingProposer, GreedyProposer,
                                                        GridSearchProposer, UniformProposer)
    topo = topology(cluster, world_size)
    kw = {}
    if proposers == "search":
        kw["proposer"] = [GridSearchProposer(max_proposals=100_000), GreedyProposer(), GreedyProposer(use_depth=False),
                          UniformProposer(), DynamicProgrammingProposer()]
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=wl.batch_size_per_rank,
                                       constraints=_constraints(wl, None), **kw)
    planner.plan(_module(wl), [EmbeddingBagCollectionSharder()])
    best = planner._best_plan  # the ShardingOptions TorchRec chose, with perf and ranks
    placements = []
    for o in best:
        ranks = tuple(s.rank for s in o.shards)
        cache = 0.0
        if ComputeKernel(o.compute_kernel) is ComputeKernel.UVM_CACHING:
            # no cache_params: TorchRec's planner sizes the cache at its UVM_CACHING_RATIO
            cache = o.cache_params.load_factor if (o.cache_params and o.cache_params.load_factor) else _uvm_caching_ratio()
        placements.append(TablePlacement(table=o.name[len(TABLE_PREFIX):], sharding=ShardingType(o.sharding_type),
                                         ranks=ranks, kernel=ComputeKernel(o.compute_kernel), cache_ratio=cache))
    order = {t.name: i for i, t in enumerate(wl.tables)}
    placements.sort(key=lambda p: order[p.table])
    return EmbeddingPlan(placements=tuple(placements), world_size=world_size), _rate(best, topo)
