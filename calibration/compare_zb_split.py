"""Price the stages calibration/gpu_zb_split.py timed with paraplan's cost model and print
measured vs predicted forward F, whole backward, and the zero-bubble split B (input
gradients) and W (weight gradients).

The model's stage is the middle stage of a three-stage zb plan of paraplan run's model (so
no embedding, head or loss), as `paraplan run` would predict it (cost/evaluate.py
StageTimes: forward_s, backward_s, weight_grad_s; B = backward_s − weight_grad_s), with one
micro-batch: the host's queue starts on an idle GPU, as the script timed it.

Usage: python calibration/compare_zb_split.py zb_split.json PROFILE...
"""
import json
import sys
from dataclasses import replace

from paraplan.cost.evaluate import evaluate
from paraplan.plan.axes import AttentionKernel, Schedule
from paraplan.plan.space import PlanBatch
from paraplan.run.cli import config_from_argv
from paraplan.specs.catalog import load_cluster


def predicted(r: dict, hw: str) -> tuple[float, float, float, float]:
    """(F, whole backward, B, W) of the row's stage of r['layers'] layers on `hw`: F and the
    whole backward from a 1f1b plan, B and W from the zb plan."""
    argv = ["--model", "llama3-8b", "--layers", str(3 * r["layers"]), "--hidden", str(r["hidden"]),
            "--heads", str(r["heads"]), "--kv-heads", str(r["kv_heads"]), "--ffn", str(r["ffn"]),
            "--vocab", "512", "--seq", str(r["seq"]), "--mb", str(r["micro_batch"]),
            "--batch", str(3 * r["micro_batch"]), "--pp", "3", "--schedule", "zb", "--device", "cpu"]
    cfg = config_from_argv(argv)  # built as for the CPU (no GPU here); the workload is the bf16 one
    # the kernel torch picked in the runs on this GPU (run reports' plan.attention); fp32
    # parameters run under autocast, bf16 ones without
    plan = replace(cfg.plan, attention=AttentionKernel.FLASH3, autocast=not r["bf16_params"])
    cluster = load_cluster(hw, num_gpus=3)
    one_mb = replace(cfg.workload, global_batch_size=r["micro_batch"])  # (paraplan run would want m >= pp)
    one = lambda x: float(x.reshape(-1)[0]) if hasattr(x, "reshape") else float(x)  # noqa: E731
    zb, plain = (evaluate(cfg.model, cluster, one_mb, PlanBatch.from_plans([pl])).middle
                 for pl in (plan, replace(plan, schedule=Schedule.ONE_F_ONE_B)))
    return (one(plain.forward_s), one(plain.backward_s), one(zb.backward_s) - one(zb.weight_grad_s),
            one(zb.weight_grad_s))


def main(argv):
    data = json.load(open(argv[0]))
    print(f"measured on {data['device']}, torch {data['torch']}")
    for hw in argv[1:]:
        print(f"\npredicted on {hw} (middle stage; F and bwd of a 1f1b plan, B and W of a zb plan)")
        head = f"{'stage':28s} {'params':6s}"
        for name in ("F", "bwd", "B", "W"):
            head += f" {'meas ' + name:>9s} {'pred ' + name:>9s} {'err':>7s}"
        print(head + f" {'(B+W)/bwd':>10s} {'W/bwd meas':>10s} {'pred':>6s}")
        errs = {k: [] for k in ("F", "bwd", "B", "W")}
        for r in data["rows"]:
            f, bwd, b, w = predicted(r, hw)
            line = f"{r['label']:28s} {'bf16' if r['bf16_params'] else 'fp32':6s}"
            for name, meas, pred in (("F", r["forward_s"], f), ("bwd", r["backward_s"], bwd),
                                     ("B", r["backward_input_s"], b), ("W", r["backward_weight_s"], w)):
                errs[name].append(pred / meas - 1)
                line += f" {meas * 1e3:8.2f}m {pred * 1e3:8.2f}m {pred / meas - 1:+7.1%}"
            print(line + f" {r['split_over_full']:10.3f} {r['backward_weight_s'] / r['backward_s']:10.3f} "
                  f"{w / bwd:6.3f}")
        print("mean |error|: " + ", ".join(f"{k} {sum(map(abs, v)) / len(v):.1%}" for k, v in errs.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
