"""Input the CLI used to take wrongly. User files read the same way whatever their format (a
UTF-8 byte-order mark dropped, a duplicated JSON key refused as TOML refuses one, a GPU's
usable memory agreeing with its datasheet size); flags and validation rows refused with the
field and what is allowed; and the advice of search and serve when nothing fits or meets
the targets."""

from __future__ import annotations

import codecs
import itertools
import json

import pytest

from paraplan import units
from paraplan.errors import FileFormatError
from paraplan.specs.catalog import load_cluster
from paraplan.specs.hf import model_from_hf_config
from support import (GPU_ROW, INFERENCE_HEADER, TRAINING_HEADER, TRAINING_ROW, assert_user_error, run,
                     write, write_csv)
from test_catalog import CLUSTER_TOML, INLINE_GPU

LLAMA = ('{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,\n'
         ' "num_attention_heads": 4, "vocab_size": 1000}')


def _bom(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_bytes(codecs.BOM_UTF8 + text.encode())
    return str(p)


def test_byte_order_mark_is_dropped_in_toml_and_json(tmp_path):
    # Windows editors save UTF-8 with a BOM; TOML used to fail on line 1 ("Invalid statement")
    # and JSON said "decode using utf-8-sig"
    inline = CLUSTER_TOML.replace('gpu = "h100"\n', "") + INLINE_GPU
    assert load_cluster(_bom(tmp_path, "c.toml", inline)).gpu.name == "my-gpu"
    assert model_from_hf_config(_bom(tmp_path, "config.json", LLAMA)).num_layers == 2


def test_not_utf8_names_the_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b'{\n"model_type": "ll\xffama"}')
    with pytest.raises(FileFormatError, match=r":2: byte 0xff is not UTF-8"):
        model_from_hf_config(str(p))


def test_duplicate_json_key_is_refused_with_its_line(tmp_path):
    text = LLAMA.replace("}", ',\n "num_hidden_layers": 4}')
    p = write(tmp_path, "config.json", text)
    with pytest.raises(FileFormatError) as e:
        model_from_hf_config(p)
    assert f"{p}:3:" in str(e.value) and "'num_hidden_layers' appears twice" in str(e.value)


def test_same_key_in_two_objects_is_fine(tmp_path):
    text = LLAMA.replace("}", ',\n "rope_scaling": {"vocab_size": 3}}')
    assert model_from_hf_config(write(tmp_path, "config.json", text)).vocab_size == 1000


def _gpu(tmp_path, extra: str):
    text = CLUSTER_TOML.replace('gpu = "h100"\n', "") + INLINE_GPU.replace("hbm_gb = 24", "hbm_gb = 24\n" + extra)
    return str(write(tmp_path, "c.toml", text))


def test_usable_memory_within_the_datasheet_size(tmp_path):
    assert load_cluster(_gpu(tmp_path, "hbm_usable_mib = 24576")).gpu.hbm_bytes == 24 * units.GIB
    # 24 typed as if it were GiB: used to make a 24 MiB GPU on which nothing fits
    with pytest.raises(FileFormatError, match=r"hbm_usable_mib' = 24 is not allowed; a number from 11445 to 24576"):
        load_cluster(_gpu(tmp_path, "hbm_usable_mib = 24"))
    with pytest.raises(FileFormatError, match=r"hbm_usable_mib' = 40000"):
        load_cluster(_gpu(tmp_path, "hbm_usable_mib = 40000"))


def test_a_gpus_architecture_is_one_paraplan_knows(tmp_path):
    from paraplan.specs.catalog import CATALOG_DIR, load_gpu
    from paraplan.specs.hardware import GPU_ARCHITECTURES
    assert load_cluster(_gpu(tmp_path, 'architecture = "Hopper"')).gpu.architecture == "Hopper"
    with pytest.raises(FileFormatError, match=r"architecture' = 'Hoper' is not allowed; one of Ampere, Ada, Hopper"):
        load_cluster(_gpu(tmp_path, 'architecture = "Hoper"'))
    # every preset names its own (validate's engine policies and fit's pools read it)
    assert all(load_gpu(p.stem).architecture in GPU_ARCHITECTURES for p in (CATALOG_DIR / "gpus").glob("*.toml"))


def test_zero_datasheet_memory_is_refused_even_with_usable_memory(tmp_path):
    text = _gpu(tmp_path, "hbm_usable_mib = 24576")
    bad = open(text).read().replace("hbm_gb = 24", "hbm_gb = 0")
    with pytest.raises(FileFormatError, match=r"hbm_gb' = 0 is not allowed"):
        load_cluster(str(write(tmp_path, "z.toml", bad)))


# ---- command-line messages ----------------------------------------------------------------


@pytest.mark.parametrize("argv", [("validate", ""), ("compare", "")])
def test_an_empty_path_is_named_as_such(capsys, argv):
    # `compare ""` used to say "is a directory" (Path("") is the working directory) and
    # `validate ""` ": no such file" with nothing before the colon
    line = assert_user_error(*run(capsys, *argv))
    assert line == "paraplan: error: '' (an empty path): no such file"


def test_an_empty_attention_kernel_is_refused_not_read_as_unset(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--attention", ""))
    assert "attention='' is not allowed; allowed: unfused, flash2, flash3" in line


def test_tp_rule_names_the_count_it_breaks(capsys):
    # TP=128 is a multiple of kv_heads=8; the rule said "(or be a multiple of kv_heads)" anyway
    line = assert_user_error(*run(capsys, "estimate", "--tp", "128", "--gpus", "1024"))
    assert line.endswith("TP=128 must divide heads=64")

def test_tp_rule_on_kv_heads_says_what_is_allowed(capsys, tmp_path):
    cfg = write(tmp_path, "config.json", LLAMA.replace('"num_attention_heads": 4', '"num_attention_heads": 48, '
                                                       '"num_key_value_heads": 16').replace('"hidden_size": 256',
                                                                                            '"hidden_size": 3072'))
    line = assert_user_error(*run(capsys, "estimate", "--model", str(cfg), "--tp", "12", "--gpus", "12",
                                  "--batch", "12", "--seq", "1024"))
    assert line.endswith("TP=12 must divide kv_heads=16 or be a multiple of it (KV heads are then replicated)")


def test_hierarchical_all_to_all_at_ep_1_is_refused(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--model", "mixtral-8x7b", "--a2a-hierarchical"))
    assert "deduplicated (hierarchical) dispatch needs EP>1" in line


def test_seq_beyond_the_models_max_is_noted(capsys):
    argv = ("estimate", "--seq", "16384", "--batch", "64", "--tp", "8", "--cp", "2", "--gpus", "128")
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "--seq 16,384 is longer than llama3-70b's max_seq_len of 8,192" in out
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0 and "max_seq_len of 8,192" in json.loads(out)["notes"][0]
    code, out, _ = run(capsys, "estimate", "--json")
    assert code == 0 and json.loads(out)["notes"] == []


# ---- training rows whose MoE columns would be ignored -------------------------------------

QWEN_ROW = {**TRAINING_ROW, "id": "moe-1", "model": "Qwen3_30B_a3B", "layers": "48", "hidden": "2048",
            "ffn_hidden": "768", "heads": "32", "kv_heads": "4", "vocab": "151936", "gated_mlp": "yes",
            "num_experts": "128", "top_k": "8", "moe_ffn_hidden": "768", "seq_len": "4096", "gpu": "H100",
            "num_gpus": "16", "precision": "FP8", "global_batch": "1024", "micro_batch": "1", "tp": "1", "pp": "1",
            "vp": "", "cp": "1", "ep": "16", "dp": "16", "sp": "", "recompute": "", "zero": "",
            "framework": "Megatron-Bridge", "metric_id": "tokens_per_s_per_gpu", "value": "8826"}


def _validate_one(capsys, tmp_path, row):
    code, out, err = run(capsys, "validate", str(write_csv(tmp_path, TRAINING_HEADER, [row])), "--json")
    return code, out, err


def test_moe_row_that_agrees_with_its_preset_is_predicted(capsys, tmp_path):
    code, out, _ = _validate_one(capsys, tmp_path, QWEN_ROW)
    assert code == 0 and json.loads(out)["summary"]["n_predicted"] == 1


@pytest.mark.parametrize("col,value,preset", [("top_k", "4", "8"), ("num_experts", "64", "128"),
                                              ("moe_ffn_hidden", "1536", "768"), ("layers", "94", "48")])
def test_moe_row_that_contradicts_its_preset_is_skipped_naming_the_cell(capsys, tmp_path, col, value, preset):
    # it used to be predicted on the preset with the row's value ignored
    code, out, err = _validate_one(capsys, tmp_path, {**QWEN_ROW, col: value})
    assert code == 1 and f"{col}='{value}' is not allowed; {preset} as in preset 'qwen3-30b-a3b'" in \
        json.loads(out)["rows"][0]["skipped"]


def test_dense_row_with_moe_columns_is_skipped(capsys, tmp_path):
    code, out, err = _validate_one(capsys, tmp_path, {**QWEN_ROW, "num_experts": ""})
    assert code == 1 and "top_k='8' is not allowed; blank on a dense row" in json.loads(out)["rows"][0]["skipped"]


# ---- serving layouts that no engine runs --------------------------------------------------


def test_serve_proposes_no_tp_that_cannot_split_the_heads():
    from paraplan.inference.planner import candidate_plans
    from paraplan.specs.catalog import load_model
    model = load_model("mpt-760m")  # 12 heads: TP 8 splits them 1.5 per GPU
    tps = {p.tp for p in candidate_plans(model, load_cluster("dgx-h100", num_gpus=8), 8)}
    assert tps == {1, 2, 4}


@pytest.mark.parametrize("tp,pp,needle", [("3", "1", "tp=3 is not allowed; TP=3 must divide heads=32"),
                                          ("1", "64", "pp=64 is not allowed; at most the 32 layers")])
def test_validate_skips_a_serving_row_no_engine_runs(capsys, tmp_path, tp, pp, needle):
    # these rows used to be predicted on a layout serve refuses
    row = {**GPU_ROW, "tp": tp, "pp": pp, "num_gpus": str(int(tp) * int(pp))}
    code, out, _ = run(capsys, "validate", str(write_csv(tmp_path, INFERENCE_HEADER, [row])), "--json")
    assert code == 1 and needle in json.loads(out)["rows"][0]["skipped"]


def test_validate_serves_a_moe_row_on_the_ep_it_states(capsys, tmp_path):
    """A stated EP is used; blank is TensorRT-LLM's default, experts split over TP (EP 1); an EP
    that does not divide TP skips the row with its reason."""
    base = {**GPU_ROW, "id": "moe", "model": "Mixtral 8x7B", "tp": "4", "num_gpus": "4", "precision": "FP8",
            "batch_or_concurrency": "max load", "input_len": "128", "output_len": "128",
            "metric_id": "output_tokens_per_s", "value": "20000"}
    rows = [base, {**base, "id": "ep4", "ep": "4"}, {**base, "id": "ep3", "ep": "3"}]
    code, out, _ = run(capsys, "validate", str(write_csv(tmp_path, INFERENCE_HEADER, rows)), "--json")
    got = {r["id"]: r for r in json.loads(out)["rows"]}
    assert "EP" not in got["moe"]["plan"] and "EP4" in got["ep4"]["plan"]
    assert got["moe"]["predicted"] != got["ep4"]["predicted"]
    assert "column 'ep': 3 is not allowed; allowed for mixtral-8x7b at tp 4: 1, 2, 4" in got["ep3"]["skipped"]


# ---- workload flags in their own units; nothing-fits advice --------------------------------

@pytest.mark.parametrize("flag,value,needle", [
    ("--price", "1e308", "argument --price: 1e+308 is not allowed; allowed: above 0 to 1e+06 $ per GPU-hour"),
    ("--storage-gb-per-s", "1e-300", "argument --storage-gb-per-s: 1e-300 is not allowed; allowed: 0.001 to 1e+06 GB/s"),
    ("--tokens", "1e30", "argument --tokens: 1e+30 is not allowed; allowed: above 0 to 1e+18 tokens"),
])
def test_workload_bounds_are_said_in_the_flags_units(capsys, flag, value, needle):
    # they used to name the Workload's fields: "storage_bytes_per_s=1e-291 is not allowed"
    line = assert_user_error(*run(capsys, "estimate", flag, value))
    assert needle in line
    assert not any(field in line for field in ("storage_bytes_per_s", "usd_per_gpu_hour", "token_budget"))


def test_search_lifts_a_schedule_restriction_to_say_what_fits(capsys):
    # --quiet: the search without the restriction is over a million plans, whose phase lines come first
    line = assert_user_error(*run(capsys, "search", "--model", "llama3.1-405b", "--gpus", "64", "--schedule", "gpipe",
                                  "--quiet"))
    # it used to stop at "no plan fits ... try more GPUs", as if the schedule did not matter
    assert line.startswith("paraplan: error: no plan with the pins (--schedule gpipe) fits")
    fastest = line.split("plans fit: the fastest is ", 1)[1]
    assert " gpipe " not in fastest and "more GPUs" not in line


def test_more_gpus_than_paraplan_plans_for_is_not_advised():
    from paraplan.plan.plan import make_plan
    from paraplan.search.planner import _nothing_fits
    from paraplan.plan.space import SpaceLimits
    from paraplan.specs.catalog import load_model
    from paraplan.specs.workload import Workload
    cluster = load_cluster("dgx-h100", num_gpus=8)
    model, wl = load_model("llama3-8b"), Workload(global_batch_size=1, seq_len=8192)
    huge = (cluster.gpu.hbm_bytes * 2**20, make_plan(tp=8, pp=1, dp=1))
    text = _nothing_fits(model, cluster, wl, 1, huge, SpaceLimits())
    assert "more GPUs" not in text and "more than the 1,048,576 paraplan plans for" in text
    assert text.endswith("try a shorter sequence")
    fits_on_more = (cluster.gpu.hbm_bytes * 4, make_plan(tp=8, pp=1, dp=1))
    assert "try more GPUs (about 32) or a shorter sequence" in _nothing_fits(model, cluster, wl, 1, fits_on_more,
                                                                            SpaceLimits())


# ---- serve when no deployment meets the targets -------------------------------------------

def test_serve_says_why_no_deployment_meets_the_targets(capsys):
    # it used to print a table of "misses" and nothing else
    code, out, _ = run(capsys, "serve", "--gpus", "4", "--tpot-ms", "5")
    assert code == 0
    lines = out.splitlines()
    first = next(i for i, x in enumerate(lines) if x.startswith("no deployment meets the targets"))
    rest = [x.strip() for x in itertools.takewhile(lambda x: x.strip() != "", lines[first + 1:])]
    line = " ".join([lines[first]] + rest)  # (wrapped at the terminal's width)
    floor = float(line.split("TPOT at best ")[1].split(" ms")[0])
    assert floor > 5 and "above the 5 ms target" in line and "TTFT" not in line
    assert "--gpus up to 8" in line  # 4 GPUs: a wider TP would lower the TPOT floor
    code, out, _ = run(capsys, "serve", "--gpus", "4", "--tpot-ms", "5", "--json")
    d = json.loads(out)
    assert d["missed_targets"] == line
    # the floor it names is the lowest lone-request TPOT of the deployments it priced
    assert floor == pytest.approx(min(e["tpot_floor_s"] for e in d["ranked"] + d["pareto"]) * 1e3, abs=0.06)
    code, out, _ = run(capsys, "serve", "--gpus", "4", "--json")
    assert json.loads(out)["missed_targets"] is None
