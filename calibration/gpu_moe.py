"""MoE layer pieces on one GPU, at the expert shapes of ../shared/validation/training_dev_moe.csv.

For each row's busiest-rank shapes (E/ep local experts of m_e routed rows each, hidden h,
expert ffn f, gated: the up-projection is h x 2f), time with CUDA events:
  * the expert GEMMs as Transformer Engine's GroupedLinear runs them: one cuBLAS GEMM per
    local expert, forward (up, down) and backward (dgrad + wgrad of each), in BF16 and in
    FP8 (torch._scaled_mm, per-tensor scales: TE's delayed/current scaling recipe);
  * the same forward as one grouped GEMM (torch._grouped_mm, BF16), where torch has it;
  * the router (GEMM T_r x h x E, softmax, top-k) and an unfused token permute / unpermute
    (sort of the expert ids, gather of T_r*k rows, weighted scatter-add back).
Each time is the median of 5 runs of 10 repetitions after warm-up. Writes $OUT/moe.json.
The shapes are written beside each time so that calibration/compare_moe.py can price them
with paraplan's cost model (no paraplan import here: the GPU machine needs torch only).
Usage (device tool): python3 calibration/gpu_moe.py
"""
import torch

from gpu_common import add_row, results, timed

dev = "cuda"
torch.manual_seed(0)
# (label, rows, h, f, local experts, m_e rows per expert, T_r tokens a rank routes, E, k)
SHAPES = [
    ("qwen3-30b ep16 (moe-001)", 4096, 2048, 768, 8, 4096, 4096, 128, 8),
    ("qwen3-30b ep8 mb1 (moe-004)", 2048, 2048, 768, 16, 2048, 4096, 128, 8),
    ("qwen3-30b ep8 mb2 (moe-006/009)", 4096, 2048, 768, 16, 4096, 8192, 128, 8),
    ("gpt-oss-120b ep8 mb1 (moe-002)", 1024, 2880, 2880, 16, 1024, 4096, 128, 4),
    ("gpt-oss-120b ep8 mb4 (moe-005)", 4096, 2880, 2880, 16, 4096, 16384, 128, 4),
    ("qwen3-235b ep32 (moe-003/007/010)", 4096, 4096, 1536, 4, 4096, 2048, 128, 8),
    ("deepseek-v3 ep64 (moe-008)", 4096, 7168, 2048, 4, 4096, 2048, 256, 8),
]


def bf16_experts(local, m, h, f):
    x = [torch.randn(m, h, device=dev, dtype=torch.bfloat16) for _ in range(local)]
    a = [torch.randn(m, f, device=dev, dtype=torch.bfloat16) for _ in range(local)]
    w1 = [torch.randn(h, 2 * f, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(local)]
    w2 = [torch.randn(f, h, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(local)]
    g2 = [torch.randn(m, h, device=dev, dtype=torch.bfloat16) for _ in range(local)]
    g1 = [torch.randn(m, 2 * f, device=dev, dtype=torch.bfloat16) for _ in range(local)]

    def fwd():
        for i in range(local):
            torch.mm(x[i], w1[i])
            torch.mm(a[i], w2[i])

    def bwd():
        for i in range(local):
            torch.mm(g2[i], w2[i].t())        # dgrad down  m x f  (k = h)
            torch.mm(a[i].t(), g2[i])         # wgrad down  f x h  (k = m)
            torch.mm(g1[i], w1[i].t())        # dgrad up    m x h  (k = 2f)
            torch.mm(x[i].t(), g1[i])         # wgrad up    h x 2f (k = m)
    return timed(fwd), timed(bwd)


def fp8_experts(local, m, h, f):
    e4 = torch.float8_e4m3fn
    one = torch.ones((), device=dev)

    def q(r, c):
        return torch.randn(r, c, device=dev).to(e4)

    def col(r, c):  # a column-major (r x c) operand, as _scaled_mm wants its second one
        return torch.randn(c, r, device=dev).to(e4).t()
    x = [q(m, h) for _ in range(local)]
    a = [q(m, f) for _ in range(local)]
    w1 = [col(h, 2 * f) for _ in range(local)]
    w2 = [col(f, h) for _ in range(local)]
    g2 = [q(m, h) for _ in range(local)]
    g1 = [q(m, 2 * f) for _ in range(local)]
    w2t = [col(h, f) for _ in range(local)]
    w1t = [col(2 * f, h) for _ in range(local)]
    at = [q(f, m) for _ in range(local)]
    xt = [q(h, m) for _ in range(local)]
    g2c = [col(m, h) for _ in range(local)]
    g1c = [col(m, 2 * f) for _ in range(local)]

    def mm(p, r):
        return torch._scaled_mm(p, r, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    def fwd():
        for i in range(local):
            mm(x[i], w1[i])
            mm(a[i], w2[i])

    def bwd():
        for i in range(local):
            mm(g2[i], w2t[i])
            mm(at[i], g2c[i])
            mm(g1[i], w1t[i])
            mm(xt[i], g1c[i])
    return timed(fwd), timed(bwd)


def grouped_fwd(local, m, h, f):
    if not hasattr(torch, "_grouped_mm"):
        return None
    x = torch.randn(local * m, h, device=dev, dtype=torch.bfloat16)
    a = torch.randn(local * m, f, device=dev, dtype=torch.bfloat16)
    w1 = torch.randn(local, 2 * f, h, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
    w2 = torch.randn(local, h, f, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.arange(1, local + 1, device=dev, dtype=torch.int32) * m

    def fwd():
        torch._grouped_mm(x, w1, offs=offs)
        torch._grouped_mm(a, w2, offs=offs)
    return timed(fwd)


def router_and_permute(T, h, E, k):
    x = torch.randn(T, h, device=dev, dtype=torch.bfloat16)
    wr = torch.randn(h, E, device=dev, dtype=torch.bfloat16) * 0.02

    def router():
        logits = torch.mm(x, wr).float()
        probs = torch.softmax(logits, dim=-1)
        return torch.topk(probs, k, dim=-1)
    top_p, top_i = router()
    flat = top_i.reshape(-1)
    src = torch.arange(T, device=dev).repeat_interleave(k)
    w = top_p.reshape(-1, 1).to(torch.bfloat16)

    def permute():
        order = torch.argsort(flat, stable=True)
        return x.index_select(0, src[order]), order
    y, order = permute()

    def unpermute():
        out = torch.zeros(T, h, device=dev, dtype=torch.bfloat16)
        out.index_add_(0, src[order], y * w[order])
        return out
    return timed(router), timed(permute), timed(unpermute)


def main():
    res = results("moe.json")
    res.update(reps=10, runs=5)
    for label, _, h, f, local, m, T, E, k in SHAPES:
        r = {"label": label, "h": h, "f": f, "local": local, "m": m, "T_r": T, "E": E, "k": k}
        for key, fn in (("bf16", lambda: bf16_experts(local, m, h, f)), ("fp8", lambda: fp8_experts(local, m, h, f))):
            try:
                r[f"{key}_fwd_s"], r[f"{key}_bwd_s"] = fn()
            except Exception as e:  # noqa: BLE001 - record and go on
                r[f"{key}_error"] = repr(e)[:300]
        try:
            r["bf16_grouped_fwd_s"] = grouped_fwd(local, m, h, f)
        except Exception as e:  # noqa: BLE001
            r["grouped_error"] = repr(e)[:300]
        try:
            r["router_s"], r["permute_s"], r["unpermute_s"] = router_and_permute(T, h, E, k)
        except Exception as e:  # noqa: BLE001
            r["router_error"] = repr(e)[:300]
        add_row(res, r)


if __name__ == "__main__":
    main()
