"""One MoE layer's per-rank compute on one GPU, as torchtitan's eager MoE runs it, at the busiest
rank's shapes of rows of ../shared/validation/training_dev_moe.csv (balanced routing, λ = 1).

The rank routes its own T_r tokens (router GEMM, fp32 softmax, top-k) and runs its E/ep local
experts over T_r·k token copies, as it would after a balanced all-to-all (the all-to-alls
themselves are not here: one GPU). Each copy's expert is taken modulo the local experts, so
every local expert gets T_r·k·ep/E rows. Then:
  permute   argsort of the expert ids, gather of the copies (index_select);
  experts   torch._grouped_mm for w1 and w3 (apart, as torchtitan's GroupedExperts), SiLU·up,
            torch._grouped_mm for w2; and again as one GEMM per expert (`loop_`: the split
            sizes read on the host, a synchronization per layer as in dropless Megatron);
  combine   the outputs weighted by the router probabilities, index_add_ back to the tokens.
Forward, and forward + backward (autograd), bf16 parameters, CUDA events, median of 5 runs of
5 after warm-up. Writes $OUT/moe_layer.json; calibration/compare_moe_layer.py prices the same.
Usage (device tool): python3 calibration/gpu_moe_layer.py
"""
import torch
import torch.nn.functional as F

from gpu_common import add_row, results, timed

dev = "cuda"
# (label, hidden, expert ffn, experts, top-k, ep, tokens a rank routes)
SHAPES = [
    ("qwen3-30b-a3b ep8, 4096 tokens", 2048, 768, 128, 8, 8, 4096),
    ("qwen3-30b-a3b ep16, 4096 tokens", 2048, 768, 128, 8, 16, 4096),
    ("gpt-oss-120b ep8, 4096 tokens", 2880, 2880, 128, 4, 8, 4096),
    ("qwen3-235b-a22b ep32, 2048 tokens", 4096, 1536, 128, 8, 32, 2048),
    ("deepseek-v3 ep64, 2048 tokens", 7168, 2048, 256, 8, 64, 2048),
]


def layer(h, f, E, k, ep, T, grouped=True):
    local = E // ep
    bf = torch.bfloat16
    x = torch.randn(T, h, device=dev, dtype=bf, requires_grad=True)
    wr = (torch.randn(h, E, device=dev, dtype=bf) * 0.02).requires_grad_()
    w1 = (torch.randn(local, h, f, device=dev, dtype=bf) * 0.02).requires_grad_()
    w3 = (torch.randn(local, h, f, device=dev, dtype=bf) * 0.02).requires_grad_()
    w2 = (torch.randn(local, f, h, device=dev, dtype=bf) * 0.02).requires_grad_()
    src = torch.arange(T, device=dev).repeat_interleave(k)

    def fwd():
        probs = torch.softmax((x @ wr).float(), dim=-1)
        top_p, top_i = torch.topk(probs, k, dim=-1)
        ids = (top_i.reshape(-1) % local)
        order = torch.argsort(ids, stable=True)
        rows = src[order]
        counts = torch.bincount(ids, minlength=local)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xp = x.index_select(0, rows)
        if grouped:
            a = F.silu(torch._grouped_mm(xp, w1, offs=offs)) * torch._grouped_mm(xp, w3, offs=offs)
            y = torch._grouped_mm(a, w2, offs=offs)
        else:  # one GEMM per expert, sized on the host (a synchronization, as dropless Megatron's)
            parts = torch.split(xp, counts.tolist())
            y = torch.cat([(F.silu(p @ w1[e]) * (p @ w3[e])) @ w2[e] for e, p in enumerate(parts)])
        y = y * top_p.reshape(-1)[order].unsqueeze(-1).to(bf)
        return torch.zeros(T, h, device=dev, dtype=bf).index_add(0, rows, y)

    def fwd_bwd():
        fwd().float().sum().backward()
        for t in (x, wr, w1, w3, w2):
            t.grad = None

    with torch.no_grad():
        t_f = timed(fwd, reps=5)
    t_fb = timed(fwd_bwd, reps=5)
    return t_f, t_fb


def main():
    res = results("moe_layer.json")
    for label, h, f, E, k, ep, T in SHAPES:
        r = {"label": label, "hidden": h, "moe_ffn": f, "experts": E, "top_k": k, "ep": ep, "tokens": T}
        for key, grouped in (("", True), ("loop_", False)):
            try:
                r[f"{key}fwd_s"], r[f"{key}fwd_bwd_s"] = layer(h, f, E, k, ep, T, grouped)
            except Exception as e:  # noqa: BLE001 - record and go on
                r[f"{key}error"] = repr(e)[:400]
        add_row(res, r)


if __name__ == "__main__":
    main()
