"""Adam accumulation (AdamA; Zhang et al. 2023, "AdamA: Adam Accumulation to Reduce Memory
Footprints of both Activations and Gradients for Large-scale DNN Training", Algorithm 1):
the physics of what paraplan prices, not a published figure. The paper's memory and
throughput numbers are for its own models and cluster, which cannot be rebuilt from what is
here (docs/model/memory.md says so); these checks build the expected bytes and seconds from
Llama 3 8B's published shape (Dubey et al. 2024, Table 3: 32 layers, model dimension 4,096,
FFN dimension 14,336, 32 heads, 8 KV heads, vocabulary 128,256, untied output head) and the
GPU's datasheet numbers, not from the cost model's own parameter counts.
"""

from __future__ import annotations

import pytest

from paraplan import api
from paraplan.specs.catalog import load_cluster

H, FFN, KV_DIM, VOCAB, LAYERS = 4096, 14336, 8 * 128, 128_256, 32
LAYER_PARAMS = H * (H + 2 * KV_DIM) + H * H + 3 * H * FFN + 2 * H   # QKV, output, SwiGLU MLP, two norms
ENDS_PARAMS = 2 * VOCAB * H + H                                       # embedding, output head, final norm
STAGE_PARAMS = LAYERS * LAYER_PARAMS + ENDS_PARAMS                    # 8.03 B
GRAD_BYTES = 4.0  # fp32 main_grad
KW = dict(model="llama3-8b", cluster="dgx-h100", seq_len=4096, global_batch_size=64, tp=1, pp=1, zero="1")


def _pair(**kw):
    args = {**KW, **kw}
    return api.estimate(**args), api.estimate(**args, adam_accumulation=True)


def test_llama3_8b_parameters():
    assert STAGE_PARAMS == 8_030_261_248


def test_gradients_at_the_peak_are_the_ends_and_two_layer_buckets_under_an_overlapped_reduction():
    plain, adama = _pair(gpus=8, dp=8)
    assert plain.memory.gradients_bytes == pytest.approx(GRAD_BYTES * STAGE_PARAMS, rel=1e-12)
    assert adama.memory.gradients_bytes == pytest.approx(GRAD_BYTES * (ENDS_PARAMS + 2 * LAYER_PARAMS), rel=1e-12)
    saved = plain.memory.gradients_bytes - adama.memory.gradients_bytes
    assert saved == pytest.approx(GRAD_BYTES * (LAYERS - 2) * LAYER_PARAMS, rel=1e-12)  # 24.4 GiB
    # the weights, optimizer states and activations do not change
    for part in ("weights_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes"):
        assert getattr(adama.memory, part) == getattr(plain.memory, part)


def test_one_layer_bucket_without_data_parallelism_and_no_saving_when_the_reduction_waits():
    _, alone = _pair(gpus=1, dp=1)
    assert alone.memory.gradients_bytes == pytest.approx(GRAD_BYTES * (ENDS_PARAMS + LAYER_PARAMS), rel=1e-12)
    plain, waits = _pair(gpus=8, dp=8, dp_overlap=False)
    assert waits.memory.gradients_bytes == plain.memory.gradients_bytes


def test_the_optimizer_step_grows_by_m_minus_1_folds_of_20_bytes_a_parameter():
    plain, adama = _pair(gpus=8, dp=8)
    m = 64 // 8
    gpu = load_cluster("dgx-h100", num_gpus=8).gpu
    shard_params = STAGE_PARAMS / 8  # ZeRO-1 over DP 8
    fold_s = (20.0 * shard_params / (gpu.hbm_bw_bytes_per_s * gpu.memory_bw_efficiency)
              + 2 * gpu.kernel_launch_overhead_s)
    assert adama.time.optimizer_s - plain.time.optimizer_s == pytest.approx((m - 1) * fold_s, rel=1e-9)
    # one micro-batch: the fold is the step's own Adam kernel
    one, one_adama = _pair(gpus=8, dp=8, global_batch_size=8)
    assert one_adama.time.optimizer_s == one.time.optimizer_s


def test_every_micro_batch_reduces_its_gradients():
    # ZeRO-0, nothing overlapped: the step's all-reduce, exposed, m times
    plain, adama = _pair(gpus=8, dp=8, zero="0", dp_overlap=False)
    assert adama.time.dp_comm_s == pytest.approx(8 * plain.time.dp_comm_s, rel=1e-12)
    assert plain.time.dp_comm_s > 0.0
    # overlapped: more is exposed and more hidden than with one reduction a step
    plain, adama = _pair(gpus=8, dp=8)
    assert adama.time.dp_comm_s > plain.time.dp_comm_s
    assert adama.overlapped.dp_comm_s > plain.overlapped.dp_comm_s
    # every other part of the step is the same
    for part in ("compute_s", "tp_comm_s", "pp_comm_s", "bubble_s", "recompute_s"):
        assert getattr(adama.time, part) == getattr(plain.time, part)
