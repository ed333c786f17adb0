"""Price the MoE layers calibration/gpu_moe_layer.py ran with paraplan's MoE cost model
(cost/moe.py moe_layer_costs: router, permutation, grouped expert GEMMs, activation; the
all-to-alls apart) and print measured vs predicted, forward and forward + backward.

Usage: python calibration/compare_moe_layer.py calibration/h100_2026-11-23/moe_layer/moe_layer.json PROFILE...
"""
import json
import sys
from dataclasses import replace

from paraplan.cost.moe import moe_layer_costs
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

PRESET = {2048: "qwen3-30b-a3b", 2880: "gpt-oss-120b", 4096: "qwen3-235b-a22b", 7168: "deepseek-v3"}


def main(argv):
    data = json.load(open(argv[0]))
    print(f"measured on {data['device']}, torch {data['torch']}")
    for hw in argv[1:]:
        print(f"\npredicted on {hw} (eager engine: w1, w3 apart; balanced routing)")
        print(f"{'layer':36s} {'variant':8s} {'meas fwd':>9s} {'pred fwd':>9s} {'err':>7s} {'meas f+b':>9s} "
              f"{'pred f+b':>9s} {'err':>7s}")
        for r in data["rows"]:
            model = load_model(PRESET[r["hidden"]])
            # the script runs the routed experts only (DeepSeek-V3's shared expert apart)
            model = replace(model, shared_expert_ffn_hidden_size=0)
            assert (model.hidden_size, model.moe_ffn_hidden_size, model.num_experts, model.top_k) == (
                r["hidden"], r["moe_ffn"], r["experts"], r["top_k"]), r["label"]
            cluster = load_cluster(hw, num_gpus=r["ep"])
            wl = Workload(global_batch_size=r["ep"], seq_len=r["tokens"], precision="bf16", moe_imbalance=1.0)
            plan = make_plan(dp=r["ep"], ep=r["ep"], fused_kernels=False)
            c = moe_layer_costs(model, cluster, wl, plan, r["tokens"], 1, Precision.BF16)
            pf, pfb = float(c.fwd_compute_s), float(c.fwd_compute_s + c.bwd_compute_s)
            for key, name in (("", "grouped"), ("loop_", "loop")):
                if f"{key}fwd_s" not in r:
                    print(f"{r['label']:36s} {name:8s} {r.get(key + 'error', '')[:80]}")
                    continue
                mf, mfb = r[f"{key}fwd_s"], r[f"{key}fwd_bwd_s"]
                print(f"{r['label']:36s} {name:8s} {mf * 1e3:8.3f}m {pf * 1e3:8.3f}m {pf / mf - 1:+7.1%} "
                      f"{mfb * 1e3:8.3f}m {pfb * 1e3:8.3f}m {pfb / mfb - 1:+7.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
