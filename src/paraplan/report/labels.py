"""Display labels of the cost model's breakdowns: the names a trace, a table and a JSON
report show for each part of a layer, of the exposed communication and of the step's tail.

The cost model computes the parts as named values; these functions key them by the text a
reader sees (the keys are part of the JSON output and the Perfetto trace: keep them stable).
"""

from __future__ import annotations

import numpy as np

from ..plan.axes import CPCommType

# the exposed CP exchange as the breakdown names it, by CPCommType code
CP_LABEL = {CPCommType.P2P.code: "CP ring send/recv", CPCommType.ALL_GATHER.code: "CP K/V all-gather",
            CPCommType.A2A.code: "CP all-to-all (Ulysses)"}
HOST_WAIT = "waiting for the host (eager)"
GEMMS_BWD = "GEMMs (dgrad+wgrad)"
MOE_BWD = "MoE (experts, router, permute, shared)"


def layer_detail(*, qkv_s, attention_fwd_s, out_s, up_s, down_s, elementwise_fwd_s, tp_fwd_s, cp_fwd_s, zero_fwd_s,
                 fsdp2_fwd_s, host_wait_s, gemms_bwd_s, gemms_wgrad_s, attention_bwd_s, elementwise_bwd_s, tp_bwd_s, cp_bwd_s,
                 zero_bwd_s, fsdp2_bwd_s, grad_casts_s, moe_wgrad_s, moe=None, grad_compression_bwd_s=0.0) -> dict:
    """Per-layer op times by label, forward ("fwd"), backward ("bwd") and the weight-gradient
    GEMMs inside the backward ("wgrad": ZB-H1's W pass); `host_wait_s`: (fwd, bwd, W);
    `moe`: the MoE layers' (experts at λ = 1, imbalance, router/permute/shared forward,
    backward, EP all-to-all forward, backward), None for a dense model."""
    detail = {
        "fwd": {"QKV GEMM": qkv_s, "attention": attention_fwd_s, "out-proj GEMM": out_s, "MLP up GEMM": up_s,
                "MLP down GEMM": down_s, "element-wise": elementwise_fwd_s, "TP collectives": tp_fwd_s,
                "CP K/V exchange": cp_fwd_s, "FSDP gather": zero_fwd_s, "FSDP2 copies": fsdp2_fwd_s,
                HOST_WAIT: host_wait_s[0]},
        "bwd": {GEMMS_BWD: gemms_bwd_s, "attention": attention_bwd_s, "element-wise": elementwise_bwd_s,
                "TP collectives": tp_bwd_s, "CP K/V exchange": cp_bwd_s, "FSDP gather/reduce": zero_bwd_s,
                "FSDP2 copies, gradient accumulation": fsdp2_bwd_s, HOST_WAIT: host_wait_s[1]},
    }
    if moe is not None:
        # MoE layers, averaged over the stage's layers like every entry here; the experts at
        # λ = 1 and what the imbalance adds to them, so that the entries add up
        experts, imbalance, rest_fwd, moe_bwd, a2a_fwd, a2a_bwd = moe
        detail["fwd"].update({"MoE experts at λ = 1 (grouped GEMMs)": experts,
                              "MoE load imbalance (in experts)": imbalance,
                              "MoE router, permute, shared": rest_fwd,
                              "EP all-to-all": a2a_fwd})
        detail["bwd"].update({MOE_BWD: moe_bwd, "EP all-to-all": a2a_bwd})
    if np.any(np.asarray(grad_compression_bwd_s) > 0.0):  # ZeRO++ qgZ's int4 quantize / dequantize
        detail["bwd"][GRAD_COMPRESSION] = grad_compression_bwd_s
    # the weight-gradient GEMMs inside each "bwd" entry: what ZB-H1 runs as its W pass
    detail["wgrad"] = {GEMMS_BWD: gemms_wgrad_s, MOE_BWD: moe_wgrad_s,
                       "element-wise": grad_casts_s, HOST_WAIT: host_wait_s[2]}
    return detail


def comm_detail(*, tp_s, cp_s, ep_s, pp_s, dp_s, sequence_parallel, cp_comm_type_code, hierarchical_a2a: bool) -> dict:
    """Exposed communication per step by collective; one batch's collectives are named by
    the kind all its plans share, else generically."""
    sp, cpc = sequence_parallel, cp_comm_type_code
    return {
        "TP " + ("all-gather+reduce-scatter" if np.all(sp) else "all-reduce" if not np.any(sp) else "collectives"): tp_s,
        # one exchange for the whole batch (an estimate): its own name
        CP_LABEL.get(int(np.min(cpc)) if np.min(cpc) == np.max(cpc) else -1, "CP K/V exchange"): cp_s,
        "EP all-to-all" + (" (deduplicated)" if hierarchical_a2a else ""): ep_s,
        "PP send/recv": pp_s,
        "DP/ZeRO collectives": dp_s,
    }


GRAD_COMPRESSION = "gradient compression kernels"
SP_NORM_ALL_REDUCE = "SP norm-gradient all-reduce"
OPTIMIZER_STEP = "optimizer step"


def step_detail(*, dp_exposed_s, sp_norm_s, optimizer_s, compression_s=0.0) -> dict:
    """The work after the pipeline, in the order it runs (for the trace); `compression_s`, the
    part of the DP time PowerSGD's kernels take, named apart where a plan has it."""
    if not np.any(np.asarray(compression_s) > 0.0):
        return {"DP/ZeRO collectives (exposed)": dp_exposed_s, SP_NORM_ALL_REDUCE: sp_norm_s,
                OPTIMIZER_STEP: optimizer_s}
    return {"DP/ZeRO collectives (exposed)": dp_exposed_s - compression_s, GRAD_COMPRESSION: compression_s,
            SP_NORM_ALL_REDUCE: sp_norm_s, OPTIMIZER_STEP: optimizer_s}
