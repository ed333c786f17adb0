"""Preset catalog (models, GPUs, clusters as TOML files) and the loaders for user files.

Each preset is one TOML file under `models/`, `gpus/` or `clusters/`, named after its
canonical `name`, with its sources in comments. Names match case-insensitively and ignore
'-', '_', '.' and ' ' ("LLAMA3_70B" == "llama3-70b"), over the name and its `aliases`.

Datasheet units (TFLOP/s, GB, TB/s, Gb/s, us) exist only in the files; they become SI here,
through `paraplan.units`. Presets are immutable and cached; user files are read each time.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ... import units
from ...errors import FileFormatError, SpecError, UnknownPresetError, shown
from ..curves import EfficiencyCurve
from ..files import MAX_COUNT, parse_toml, read_toml
from ..hardware import GPU_ARCHITECTURES, AttentionKernel, ClusterSpec, GPUSpec, LinkTier
from ..model import ModelSpec, make_model
from ..mixed import GPUGroup, MixedCluster
from ..workload import Precision

__all__ = ["list_models", "list_gpus", "list_clusters", "load_model", "load_gpu", "load_cluster",
           "load_flag_cluster", "preset_name", "CATALOG_DIR"]

CATALOG_DIR = Path(__file__).resolve().parent
_DIRS = {"model": "models", "gpu": "gpus", "cluster": "clusters"}

# ---- schemas: (required keys, optional keys) ----
_MODEL_REQUIRED = ("name", "num_layers", "hidden_size", "ffn_hidden_size", "num_heads",
                   "num_kv_heads", "vocab_size", "gated_mlp", "tied_embeddings")
# Mixture-of-experts, latent-attention, sliding-window and multi-token-prediction fields:
# non-negative integers, 0 (not used) when
# absent; moe_layer_interval is positive and 1 when absent (see ModelSpec).
_MODEL_MOE_MLA = ("num_experts", "top_k", "moe_ffn_hidden_size", "shared_expert_ffn_hidden_size",
                  "num_dense_layers", "moe_layer_interval", "expert_groups", "group_top_k",
                  "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
                  "sliding_window", "num_sliding_window_layers", "mtp_layers")
_MODEL_ROPE = ("rope_theta", "rope_llama3_scaling_factor")  # positive numbers, 0 (not stated) when absent
_MODEL_OPTIONAL = ("head_dim", "max_seq_len") + _MODEL_MOE_MLA + _MODEL_ROPE + ("source", "aliases")
_GPU_REQUIRED = ("name", "peak_tflops", "hbm_gb", "hbm_tb_per_s", "tdp_watts", "host_link_gb_per_s",
                 "gemm_efficiency", "attention_efficiency")
_GPU_OPTIONAL = ("hbm_usable_mib", "kernel_launch_overhead_us", "tp_collective_overhead_us", "eager_layer_host_us",
                 "moe_dispatch_host_us",
                 "zb_input_host_us", "zb_weight_host_us",
                 "memory_bw_efficiency",
                 "elementwise_efficiency", "eager_elementwise_efficiency",
                 "optimizer_efficiency", "loss_efficiency", "scatter_add_efficiency",
                 "fp8_gemm_efficiency_ratio", "fp8_rowwise_gemm_efficiency_ratio", "misaligned_gemm_efficiency_ratio",
                 "compiled_elementwise_ratio", "reserved_gb", "allocator_fragmentation", "overlap_slowdown", "host_adam_params_per_s",
                 "sustained_compute_ratio", "power_limit_watts",
                 "checked_against", "source", "aliases", "architecture")
_CLUSTER_REQUIRED = ("name", "gpu", "gpus_per_node", "nvlink", "scaleout")
_CLUSTER_OPTIONAL = ("num_gpus", "usd_per_gpu_hour", "gpus_per_island", "dcn", "source", "aliases",
                     "host_memory_gb_per_host", "gpus_per_host", "host_memory_gb_per_s_per_host")
# Physical bounds on bandwidths and latencies (a 1e-300 GB/s link would price a step at
# centuries): 1 MB/s is slower than any network or memory, 1 PB/s a thousand times NVLink 5;
# a latency from 1 ns to 1 s. Calibrated CPU profiles (gloo, DRAM) sit well inside them.
_GB_PER_S = (1e-3, 1e6)
_GBIT_PER_S = tuple(8.0 * x for x in _GB_PER_S)  # 8 bits per byte
_TB_PER_S = tuple(x / 1e3 for x in _GB_PER_S)
_LATENCY_US = (1e-3, 1e6)
# The physical range of every other number of a GPU or cluster file, in the file's units
# (docs/model.md, 'Hardware parameters'): wide enough for a CPU measured by paraplan calibrate
# and for GPUs a generation or two ahead, narrow enough that no step time, energy or cost
# overflows to inf or nan (1e308 TFLOP/s, 1e308 W and 1e-300 efficiencies did).
_PEAK_TFLOPS = (1e-4, 1e5)  # 0.1 GFLOP/s (one CPU core) to 100 PFLOP/s (B300's FP4 is 15)
_HBM_GB = (1e-3, 1e5)  # 1 MB to 100 TB (B300: 288 GB)
_TDP_WATTS = (1.0, 1e5)  # 1 W to 100 kW (GB200 superchip: 2.7 kW)
_HOST_US = (0.0, 1e6)  # a host overhead: none to 1 s per kernel, collective or layer
_EFFICIENCY = (1e-4, 1.0)  # an achieved share of a peak (or a ratio of two): a 10,000x slowdown at most
_ADAM_PARAMS_PER_S = (1e3, 1e15)  # a host optimizer's parameter updates per second
_USD_PER_GPU_HOUR = (1e-6, 1e6)
_HOST_MEMORY_GB = (1e-3, 1e6)  # per host: 1 MB to 1 PB
_TIER_REQUIRED = ("latency_us", "efficiency")
_TIER_OPTIONAL = ("gb_per_s", "gbit_per_s", "efficiency_bytes", "all_gather", "reduce_scatter")


def _norm(name: str) -> str:
    """Matching key: lower case, without '-', '_', '.', ' '."""
    return re.sub(r"[-_. ]", "", name.strip().lower())


# ---------------------------------------------------------------------------------------
# Checking TOML fields with errors that name the file, the line and the field (the file is
# read by specs/files.py read_toml).
# ---------------------------------------------------------------------------------------

def _line_of(text: str, section: str, key: str) -> int | None:
    current = ""
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for i, raw in enumerate(text.splitlines(), start=1):
        header = re.match(r"^\s*\[\s*([^\]]+?)\s*\]", raw)
        if header:
            current = header.group(1)
        elif current == section and pattern.match(raw):
            return i
    if section:  # maybe an inline table: point at its key in the parent table
        parent, _, last = section.rpartition(".")
        return _line_of(text, parent, last)
    return None


@dataclass(frozen=True)
class TomlTable:
    """One TOML table of a file, with the helpers that check its fields."""

    data: dict
    shown: str  # file name as shown in errors
    text: str  # raw file text, to find line numbers
    prefix: str = ""  # "" for the top level, "nvlink." for [nvlink], ...

    def line_of(self, key: str) -> int | None:
        """Line of `key = ...` inside this table, for error messages; for an inline table
        (`gpu = { ... }`) the line of the table itself."""
        return _line_of(self.text, self.prefix.rstrip("."), key)

    def fail(self, key: str, detail: str) -> NoReturn:
        raise FileFormatError(self.shown, detail, self.line_of(key))

    def check_keys(self, required: tuple[str, ...], optional: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in required and key not in optional:
                allowed = ", ".join(required + optional)
                self.fail(key, f"unknown field '{self.prefix}{key}' (allowed: {allowed})")
        for key in required:
            if key not in self.data:
                raise FileFormatError(self.shown, f"field '{self.prefix}{key}' missing "
                                                  f"(required: {', '.join(required)})")

    def _bad(self, key: str, value: object, expected: str) -> NoReturn:
        self.fail(key, f"field '{self.prefix}{key}' = {shown(value)} is not allowed; {expected} is required")

    def int_(self, key: str, default: int | None = None) -> int | None:
        if key not in self.data:
            return default
        v = self.data[key]
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_COUNT:
            self._bad(key, v, f"an integer from 1 to {MAX_COUNT}")
        return v

    def count(self, key: str) -> int:
        """A non-negative integer (0: not used); the caller checks it is present."""
        v = self.data[key]
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_COUNT:
            self._bad(key, v, f"an integer from 0 to {MAX_COUNT} (0: not used)")
        return v

    def num(self, key: str, default: float | None = None, *, at_most_one: bool = False,
            within: tuple[float, float] | None = None) -> float | None:
        """A positive number; an efficiency in [_EFFICIENCY] with `at_most_one`; in [low, high]
        with `within`."""
        if key not in self.data:
            return default
        if at_most_one:
            within = _EFFICIENCY
        v = self.data[key]
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf
                or (within is not None and not within[0] <= v <= within[1])):
            self._bad(key, v, f"a number from {within[0]:g} to {within[1]:g}" if within is not None
                      else "a positive number")
        return float(v)

    def host_us(self, key: str) -> float | None:
        """A host overhead in microseconds, from 0 (none) to _HOST_US's bound, or None when absent."""
        return self._in_range(key, _HOST_US[1], f"a number >= 0 and below {_HOST_US[1]:g} (1 s)")

    def host_us_list(self, key: str, n: int) -> tuple[float, ...]:
        """A list of `n` host overheads in microseconds (the caller checks the key is present)."""
        v = self.data[key]
        if (not isinstance(v, list) or len(v) != n
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                           and _HOST_US[0] <= x <= _HOST_US[1] for x in v)):
            self._bad(key, v, f"a list of {n} numbers >= 0 and at most {_HOST_US[1]:g} (1 s)")
        return tuple(float(x) for x in v)

    def fraction(self, key: str) -> float | None:
        """A fraction in [0, 1) (a loss or a slowdown), or None when absent."""
        return self._in_range(key, 1.0, "a number in [0, 1)")

    def _in_range(self, key: str, below: float, allowed: str) -> float | None:
        """A number in [0, below), or None when absent."""
        if key not in self.data:
            return None
        v = self.data[key]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < below:
            self._bad(key, v, allowed)
        return float(v)

    def bool_(self, key: str) -> bool:
        v = self.data[key]
        if not isinstance(v, bool):
            self._bad(key, v, "true or false")
        return v

    def str_(self, key: str, default: str = "") -> str:
        v = self.data.get(key, default)
        if not isinstance(v, str) or (key == "name" and not v.strip()):
            self._bad(key, v, "a non-empty string" if key == "name" else "a string")
        return v

    def str_list(self, key: str) -> list[str]:
        v = self.data.get(key, [])
        if not isinstance(v, list) or not all(isinstance(s, str) and s.strip() for s in v):
            self._bad(key, v, "a list of non-empty strings")
        return v

    def sub(self, key: str) -> "TomlTable":
        v = self.data[key]
        if not isinstance(v, dict):
            self._bad(key, v, f"a table [{self.prefix}{key}]")
        return TomlTable(v, self.shown, self.text, f"{self.prefix}{key}.")

    def curve(self, key: str, x_key: str) -> EfficiencyCurve:
        """[key] with `x_key = [...]` and `efficiency = [...]`; or a constant `efficiency = 0.8`."""
        t = self
        if key:
            t = self.sub(key)
            t.check_keys(("efficiency",), (x_key,))
        y = t.data.get("efficiency")
        x = t.data.get(x_key)
        where = f"{t.prefix}{x_key}/{t.prefix}efficiency"
        if x is None and isinstance(y, (int, float)) and not isinstance(y, bool):
            t.num("efficiency", at_most_one=True)
            return EfficiencyCurve.constant(float(y))
        for k, v in ((x_key, x), ("efficiency", y)):
            if not isinstance(v, list) or not v or not all(
                    isinstance(e, (int, float)) and not isinstance(e, bool) for e in v):
                t._bad(k, v, "a non-empty list of numbers")
        low = next((e for e in y if 0 < e < _EFFICIENCY[0]), None)
        if low is not None:
            t._bad("efficiency", y, f"a list of numbers from {_EFFICIENCY[0]:g} to {_EFFICIENCY[1]:g} ({low:g} is below)")
        try:
            return EfficiencyCurve(x=tuple(float(e) for e in x), y=tuple(float(e) for e in y))
        except ValueError as e:
            t.fail(x_key, f"{where}: {e}")


# ---------------------------------------------------------------------------------------
# Building the spec dataclasses from parsed TOML.
# ---------------------------------------------------------------------------------------

def _model_from_table(t: TomlTable) -> ModelSpec:
    t.check_keys(_MODEL_REQUIRED, _MODEL_OPTIONAL)
    t.str_list("aliases")
    moe_mla = {k: t.int_(k) if k == "moe_layer_interval" else t.count(k)
               for k in _MODEL_MOE_MLA if k in t.data}
    moe_mla.update({k: t.num(k) for k in _MODEL_ROPE if k in t.data})
    try:
        return make_model(
            name=t.str_("name"), num_layers=t.int_("num_layers"), hidden_size=t.int_("hidden_size"),
            ffn_hidden_size=t.int_("ffn_hidden_size"), num_heads=t.int_("num_heads"),
            num_kv_heads=t.int_("num_kv_heads"), head_dim=t.int_("head_dim"),
            vocab_size=t.int_("vocab_size"), gated_mlp=t.bool_("gated_mlp"),
            tied_embeddings=t.bool_("tied_embeddings"), max_seq_len=t.int_("max_seq_len", 0),
            source=t.str_("source"), **moe_mla)
    except SpecError as e:
        t.fail(e.field, str(e))


def _attention_curves(t: TomlTable) -> dict:
    """[attention_efficiency.flash2] (required) and [attention_efficiency.flash3] (Hopper+)."""
    att = t.sub("attention_efficiency")
    optional = tuple(str(k) for k in AttentionKernel if k not in (AttentionKernel.UNFUSED, AttentionKernel.FLASH2))
    att.check_keys((str(AttentionKernel.FLASH2),), optional)
    return {AttentionKernel(k): att.curve(k, "flops") for k in att.data}


def _gpu_from_table(t: TomlTable) -> GPUSpec:
    t.check_keys(_GPU_REQUIRED, _GPU_OPTIONAL)
    t.str_list("aliases")
    peaks_t = t.sub("peak_tflops")
    allowed = tuple(str(p) for p in Precision)
    peaks_t.check_keys((), allowed)
    if not peaks_t.data:
        t._bad("peak_tflops", {}, f"at least one of {', '.join(allowed)}")
    peak_flops_per_s = {Precision(k): units.tflops(peaks_t.num(k, within=_PEAK_TFLOPS)) for k in peaks_t.data}
    launch_us = t.num("kernel_launch_overhead_us", within=_LATENCY_US)
    extra = {}
    if launch_us is not None:
        extra["kernel_launch_overhead_s"] = units.us(launch_us)
    if "tp_collective_overhead_us" in t.data:
        extra["tp_collective_overhead_s"] = units.us(t.host_us("tp_collective_overhead_us"))
    for key in ("eager_layer_host_us", "moe_dispatch_host_us"):
        if key in t.data:
            extra[key.removesuffix("_us") + "_s"] = units.us(t.host_us(key))
    for key in ("zb_input_host_us", "zb_weight_host_us"):
        if key in t.data:
            extra[key.removesuffix("_us") + "_s"] = tuple(units.us(c) for c in t.host_us_list(key, 3))
    for key in ("memory_bw_efficiency", "elementwise_efficiency", "eager_elementwise_efficiency",
                "optimizer_efficiency", "loss_efficiency",
                "scatter_add_efficiency",
                "fp8_gemm_efficiency_ratio", "fp8_rowwise_gemm_efficiency_ratio", "compiled_elementwise_ratio",
                "misaligned_gemm_efficiency_ratio", "sustained_compute_ratio"):
        if key in t.data:
            extra[key] = t.num(key, at_most_one=True)
    for key in ("allocator_fragmentation", "overlap_slowdown"):
        if key in t.data:
            extra[key] = t.fraction(key)
    hbm_gb = t.num("hbm_gb", within=_HBM_GB)
    hbm_bytes = units.gbytes(hbm_gb)
    if "hbm_usable_mib" in t.data:
        # the driver's memory.total: the datasheet's "80GB" is up to 80 GiB (A100), and never
        # under half of it (a value in GB or GiB typed as MiB)
        low, high = math.ceil(hbm_bytes / 2 / units.MIB), math.floor(hbm_gb * units.GIB / units.MIB)
        hbm_bytes = t.num("hbm_usable_mib", within=(low, high)) * units.MIB
    if "reserved_gb" in t.data:
        reserved_gb = t.num("reserved_gb")
        if reserved_gb >= hbm_gb:
            t._bad("reserved_gb", reserved_gb, f"less than hbm_gb={hbm_gb}")
        extra["reserved_bytes"] = units.gbytes(reserved_gb)
    if "host_adam_params_per_s" in t.data:
        extra["host_adam_params_per_s"] = t.num("host_adam_params_per_s", within=_ADAM_PARAMS_PER_S)
    if "power_limit_watts" in t.data:  # nvidia-smi -pl: a board limit below the TDP slows the clock
        extra["power_limit_watts"] = t.num("power_limit_watts", within=_TDP_WATTS)
    return GPUSpec(
        name=t.str_("name"), peak_flops_per_s=peak_flops_per_s,
        # the driver's memory.total when known (the datasheet's "80GB" is 80 GiB on A100)
        hbm_bytes=hbm_bytes,
        hbm_bw_bytes_per_s=t.num("hbm_tb_per_s", within=_TB_PER_S) * units.TERA,  # TB/s (decimal) -> bytes/s
        tdp_watts=t.num("tdp_watts", within=_TDP_WATTS),
        host_link_bw_unidir_bytes_per_s=units.gbytes_per_s(t.num("host_link_gb_per_s", within=_GB_PER_S)),
        gemm_efficiency=t.curve("gemm_efficiency", "flops"),
        attention_efficiency=_attention_curves(t),
        checked_against=t.str_("checked_against"), source=t.str_("source"), architecture=_architecture(t), **extra)


def _architecture(t: TomlTable) -> str:
    """The GPU's architecture family ("" when the file names none), one of GPU_ARCHITECTURES."""
    name = t.str_("architecture")
    if name and name not in GPU_ARCHITECTURES:
        t._bad("architecture", name, f"one of {', '.join(GPU_ARCHITECTURES)}")
    return name


def _tier_from_table(t: TomlTable, name: str) -> LinkTier:
    t = t.sub(name)
    t.check_keys(_TIER_REQUIRED, _TIER_OPTIONAL)
    has_gb, has_gbit = "gb_per_s" in t.data, "gbit_per_s" in t.data
    if has_gb == has_gbit:
        raise FileFormatError(t.shown, f"[{name}] needs exactly one of 'gb_per_s' (GB/s, per GPU, one "
                                       f"direction) or 'gbit_per_s' (network line rate per GPU, Gb/s)",
                              t.line_of("gb_per_s") or t.line_of("gbit_per_s"))
    bw = (units.gbytes_per_s(t.num("gb_per_s", within=_GB_PER_S)) if has_gb
          else units.gbits_per_s(t.num("gbit_per_s", within=_GBIT_PER_S)))
    # [tier.all_gather] / [tier.reduce_scatter]: that collective's own efficiency curve
    ops = tuple((op, t.curve(op, "efficiency_bytes")) for op in ("all_gather", "reduce_scatter") if op in t.data)
    return LinkTier(name=name, bw_unidir_bytes_per_s=bw, latency_s=units.us(t.num("latency_us", within=_LATENCY_US)),
                    efficiency=t.curve("", "efficiency_bytes"), op_efficiency=ops)


def _cluster_from_table(t: TomlTable, base_dir: Path | None) -> ClusterSpec:
    t.check_keys(_CLUSTER_REQUIRED, _CLUSTER_OPTIONAL)
    t.str_list("aliases")
    gpu_field = t.data["gpu"]
    if isinstance(gpu_field, dict):
        gpu = _gpu_from_table(t.sub("gpu"))
    elif isinstance(gpu_field, str):
        gpu_path = Path(gpu_field).expanduser()
        if base_dir is not None and not gpu_path.is_absolute():
            gpu_path = base_dir / gpu_path
        if gpu_field.lower().endswith(".toml"):
            gpu = _gpu_from_file(gpu_path)
        else:
            try:
                gpu = load_gpu(gpu_field)
            except UnknownPresetError as e:
                t.fail("gpu", f"field 'gpu': {e}")
    else:
        t._bad("gpu", gpu_field, "a GPU preset name, a path to a GPU .toml file, or a [gpu] table")
    gpus_per_node = t.int_("gpus_per_node")
    dcn = _tier_from_table(t, "dcn") if "dcn" in t.data else None
    extra = {}
    if "usd_per_gpu_hour" in t.data:
        extra["usd_per_gpu_hour"] = t.num("usd_per_gpu_hour", within=_USD_PER_GPU_HOUR)
    if "host_memory_gb_per_host" in t.data:
        extra["host_memory_bytes_per_host"] = units.gbytes(t.num("host_memory_gb_per_host", within=_HOST_MEMORY_GB))
    if "gpus_per_host" in t.data:
        extra["gpus_per_host"] = t.int_("gpus_per_host")
    if "host_memory_gb_per_s_per_host" in t.data:
        extra["host_memory_bw_bytes_per_s_per_host"] = units.gbytes(
            t.num("host_memory_gb_per_s_per_host", within=_GB_PER_S))
    try:
        return ClusterSpec(
            name=t.str_("name"), gpu=gpu, num_gpus=t.int_("num_gpus", gpus_per_node),
            gpus_per_node=gpus_per_node, nvlink=_tier_from_table(t, "nvlink"),
            scaleout=_tier_from_table(t, "scaleout"), gpus_per_island=t.int_("gpus_per_island", 0),
            dcn=dcn, source=t.str_("source"), **extra)
    except SpecError as e:
        t.fail(e.field, str(e))


def _model_from_file(path: Path) -> ModelSpec:
    data, text = read_toml(path, str(path))
    return _model_from_table(TomlTable(data, str(path), text))


def _gpu_from_file(path: Path) -> GPUSpec:
    data, text = read_toml(path, str(path))
    return _gpu_from_table(TomlTable(data, str(path), text))


def _cluster_from_file(path: Path) -> ClusterSpec:
    data, text = read_toml(path, str(path))
    return _cluster_from_table(TomlTable(data, str(path), text), path.parent)


def cluster_from_text(text: str, shown: str) -> ClusterSpec:
    """A cluster from TOML text in the cluster schema with its GPU inline (a hardware profile
    that calibrate is writing); errors name `shown`."""
    return _cluster_from_table(TomlTable(parse_toml(text, shown), shown, text), None)


# ---------------------------------------------------------------------------------------
# Registry of presets.
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Registry:
    files: dict  # canonical name -> Path
    keys: dict  # normalized name or alias -> canonical name
    known: tuple  # canonical names and aliases, for "did you mean"


@functools.lru_cache(maxsize=None)
def _registry(kind: str) -> _Registry:
    files, keys, aliases = {}, {}, []
    for path in sorted((CATALOG_DIR / _DIRS[kind]).glob("*.toml")):
        shown = f"{_DIRS[kind]}/{path.name}"
        data, text = read_toml(path, shown)
        t = TomlTable(data, shown, text)
        name = t.str_("name")
        files[name] = path
        for alias in [name] + t.str_list("aliases"):
            other = keys.setdefault(_norm(alias), name)
            if other != name:  # a defect of the catalog itself, not a user mistake
                raise RuntimeError(f"{shown}: {kind} alias {alias!r} also names preset {other!r}")
            aliases.append(alias)
    # Suggestions: canonical names first, then only aliases that spell something else.
    seen = {_norm(n) for n in files}
    known = list(files)
    for alias in aliases:
        if _norm(alias) not in seen:
            seen.add(_norm(alias))
            known.append(alias)
    return _Registry(files=files, keys=keys, known=tuple(known))


def _lookup(kind: str, name: str) -> str | None:
    reg = _registry(kind)
    canonical = reg.keys.get(_norm(name))
    if canonical is None and "/" in name:  # "meta-llama/Meta-Llama-3-8B" -> "Meta-Llama-3-8B"
        canonical = reg.keys.get(_norm(name.rsplit("/", 1)[1]))
    return canonical


def preset_name(kind: str, name: str) -> str:
    """The canonical name of the `kind` preset named `name` (or an alias; never a file);
    UnknownPresetError, with the closest names, otherwise."""
    canonical = _lookup(kind, name)
    if canonical is None:
        raise UnknownPresetError(kind, name, list(_registry(kind).known))
    return canonical


def _preset_table(kind: str, canonical: str) -> TomlTable:
    path = _registry(kind).files[canonical]
    shown = f"{_DIRS[kind]}/{path.name}"
    data, text = read_toml(path, shown)
    return TomlTable(data, shown, text)


@functools.lru_cache(maxsize=None)
def _preset_model(canonical: str) -> ModelSpec:
    return _model_from_table(_preset_table("model", canonical))


@functools.lru_cache(maxsize=None)
def _preset_gpu(canonical: str) -> GPUSpec:
    return _gpu_from_table(_preset_table("gpu", canonical))


@functools.lru_cache(maxsize=None)
def _preset_cluster(canonical: str) -> ClusterSpec:
    return _cluster_from_table(_preset_table("cluster", canonical), None)


def _resolve(kind: str, name_or_path: str, suffixes: tuple[str, ...]) -> tuple[str, object]:
    """('preset', canonical name) or ('file', Path); raises UnknownPresetError otherwise."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise SpecError(kind, "name", name_or_path, "a preset name or a file path is required")
    text = os.fspath(name_or_path)
    if not text.strip():
        raise SpecError(kind, "name", text, "a preset name or a file path is required")
    path = Path(text).expanduser()
    if isinstance(name_or_path, os.PathLike) or text.lower().endswith(suffixes):
        return "file", path
    canonical = _lookup(kind, text)
    if canonical is not None:
        return "preset", canonical
    try:
        if path.exists():
            return "file", path
        why = "no such file"
    except OSError as e:  # a name too long for a file, a symbolic-link loop
        why = f"cannot use path: {e.strerror or e}"
    if "/" in text or os.sep in text:
        raise FileFormatError(text, f"{why}, and no {kind} preset of that name "
                                    f"(see `paraplan presets`)")
    raise UnknownPresetError(kind, text, list(_registry(kind).known))


# ---------------------------------------------------------------------------------------
# Public API.
# ---------------------------------------------------------------------------------------

def list_models() -> list[str]:
    """Canonical names of the model presets."""
    return sorted(_registry("model").files)


def list_gpus() -> list[str]:
    """Canonical names of the GPU presets."""
    return sorted(_registry("gpu").files)


def list_clusters() -> list[str]:
    """Canonical names of the cluster presets."""
    return sorted(_registry("cluster").files)


def load_model(name_or_path: str | os.PathLike) -> ModelSpec:
    """A model preset (name or alias), a TOML file in the model schema, or a Hugging Face
    config.json (or a directory holding one)."""
    how, what = _resolve("model", name_or_path, (".toml", ".json"))
    if how == "preset":
        return _preset_model(what)
    try:
        is_dir = what.is_dir()
    except OSError as e:  # a name too long for a file, a symbolic-link loop
        raise FileFormatError(str(what), f"cannot use path: {e.strerror or e}") from None
    if is_dir or what.suffix.lower() == ".json":
        from ..hf import model_from_hf_config
        return model_from_hf_config(what)
    return _model_from_file(what)


def load_gpu(name_or_path: str | os.PathLike) -> GPUSpec:
    """A GPU preset (name or alias) or a TOML file in the GPU schema."""
    how, what = _resolve("gpu", name_or_path, (".toml",))
    return _preset_gpu(what) if how == "preset" else _gpu_from_file(what)


def load_flag_cluster(where: str, flag: str, name_or_path: str, num_gpus: int | None = None) -> ClusterSpec:
    """load_cluster of a command-line flag's value (`--hardware`): an unknown preset is that
    flag's one-line error, with the closest names."""
    try:
        return load_cluster(name_or_path, num_gpus=num_gpus)
    except UnknownPresetError as e:
        raise SpecError(where, flag, name_or_path, str(e)) from None


def load_cluster(name_or_path: str | os.PathLike, num_gpus: int | None = None) -> ClusterSpec:
    """A cluster preset (name or alias) or a TOML file in the cluster schema, resized to
    `num_gpus` when given."""
    how, what = _resolve("cluster", name_or_path, (".toml",))
    cluster = _preset_cluster(what) if how == "preset" else _cluster_from_file(what)
    if num_gpus is None:
        return cluster
    if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus <= 0:
        raise SpecError(f"cluster {cluster.name!r}", "num_gpus", num_gpus, "a positive integer is required")
    return cluster.with_num_gpus(num_gpus)


# ---------------------------------------------------------------------------------------
# Mixed clusters: several GPU groups (specs/mixed.py).
# ---------------------------------------------------------------------------------------

_MIXED_REQUIRED = ("name", "group", "between_groups")
_MIXED_OPTIONAL = ("source", "aliases")
_GROUP_REQUIRED = ("name", "cluster", "num_gpus")


def is_mixed_cluster_file(name_or_path: str | os.PathLike) -> bool:
    """Whether `name_or_path` is a TOML file of the mixed-cluster schema (a `group` or a
    `between_groups` key at its top level)."""
    path = Path(os.fspath(name_or_path)).expanduser()
    if path.suffix.lower() != ".toml" or not path.is_file():
        return False
    data, _ = read_toml(path, str(path))
    return "group" in data or "between_groups" in data


def load_mixed_cluster(path: str | os.PathLike) -> MixedCluster:
    """A mixed cluster from its TOML file: `name`, one [[group]] table per GPU group (`name`,
    `cluster`: a preset or a cluster TOML relative to the file, `num_gpus`) and
    [between_groups], the link between groups in the tier schema ([nvlink]/[scaleout]'s)."""
    path = Path(os.fspath(path)).expanduser()
    data, text = read_toml(path, str(path))
    t = TomlTable(data, str(path), text)
    t.check_keys(_MIXED_REQUIRED, _MIXED_OPTIONAL)
    if not isinstance(data["group"], list) or not all(isinstance(g, dict) for g in data["group"]):
        t._bad("group", data["group"], "[[group]] tables")
    groups = tuple(_group_from_table(TomlTable(g, str(path), text, "group."), path.parent) for g in data["group"])
    try:
        return MixedCluster(name=t.str_("name"), groups=groups, between_groups=_tier_from_table(t, "between_groups"),
                            source=t.str_("source"))
    except SpecError as e:
        t.fail("group", str(e))


def _group_from_table(t: TomlTable, base_dir: Path) -> GPUGroup:
    t.check_keys(_GROUP_REQUIRED, ())
    where = t.str_("cluster")
    cluster_path = Path(where).expanduser()
    if where.lower().endswith(".toml") and not cluster_path.is_absolute():
        where = str(base_dir / cluster_path)
    try:
        cluster = load_cluster(where, num_gpus=t.int_("num_gpus"))
    except UnknownPresetError as e:
        t.fail("cluster", f"field 'group.cluster': {e}")
    return GPUGroup(name=t.str_("name"), cluster=cluster)
