"""Fit a GPU type's physical knobs to measured training runs (`paraplan fit`), and measure
how well fitted knobs predict runs they were not fitted on (leave-one-out; `validate --cv
source`, which fits on every source but one and predicts that one).

The knobs (docs/model.md, "Fitted knobs") are physical, one value per GPU type, bounded:

- sustained_compute_ratio in [0.5, 1.0]: the share of the microbenchmarked GEMM and
  attention throughput a training step sustains (power-capped clocks under a whole step's
  load, contention); 1.0 is the microbenchmark itself; 16- and 32-bit runs inform it.
- fp8_gemm_efficiency_ratio in [0.5, 1.0]: an FP8 GEMM's efficiency relative to the same
  BF16 GEMM's (scaling-factor work, casts, FP8 tile shapes); NVFP4 GEMMs are priced with it
  too, so FP8 and NVFP4 runs inform it (per-tensor FP8 runs; not row-wise ones).
- fp8_rowwise_gemm_efficiency_ratio in [0.5, 1.0]: under torchao's row-wise FP8 recipe, its
  GEMM's efficiency relative to the per-tensor FP8 GEMM's (a CUTLASS kernel against cuBLAS);
  row-wise FP8 runs inform it, and nothing else does.

Each run is predicted as `validate` predicts it (the best plan for its blank knobs) at every
point of a coarse grid of the knobs; between grid points the prediction is interpolated
(bilinearly). The sustained share is fitted on the 16/32-bit runs, then the FP8 ratio on the
per-tensor FP8 and NVFP4 runs at that share, then the row-wise ratio on the row-wise runs at
both, each to the value of a 0.01 grid with the least mean |error|. A row-wise run's GEMMs
run at the product of the two FP8 ratios, so its grid spans that product. A knob no run
informs keeps the preset's value. Nothing is fitted per run or source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..cost.low_precision import LOW_PRECISIONS
from ..errors import ParaplanError, SpecError
from ..specs.hardware import GPUSpec
from ..specs.workload import Fp8Recipe, Precision
from .rows import row_result
from .training import METRICS, predict_on, read_training_rows, row_cells, row_cluster, row_setup


@dataclass(frozen=True, kw_only=True)
class Knob:
    field: str                 # the GPUSpec field it sets
    low: float
    high: float
    coarse: tuple[float, ...]  # where each run is predicted
    meaning: str
    informed_by: Callable[[Precision, Fp8Recipe], bool]


KNOBS = (
    Knob(field="sustained_compute_ratio", low=0.5, high=1.0, coarse=(0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
         meaning="share of the microbenchmarked GEMM and attention throughput a training step sustains",
         informed_by=lambda precision, recipe: precision in (Precision.BF16, Precision.FP16, Precision.TF32,
                                                             Precision.FP32)),
    # NVFP4 GEMMs are priced with the same ratio (cost/roofline.py gemm_time_s): NVFP4 runs inform it
    # too, as do delayed-scaling runs (per-tensor GEMMs)
    Knob(field="fp8_gemm_efficiency_ratio", low=0.5, high=1.0, coarse=(0.5, 0.75, 1.0),
         meaning="an FP8 (and NVFP4) GEMM's efficiency relative to the same BF16 GEMM's",
         informed_by=lambda precision, recipe: precision in LOW_PRECISIONS and recipe is not Fp8Recipe.ROWWISE),
    # its coarse grid is over the product of the two FP8 ratios, the rate a row-wise run's GEMMs
    # run at (0.25 = both at 0.5); time goes as 1/ratio, steepest at the low end, so finer there
    Knob(field="fp8_rowwise_gemm_efficiency_ratio", low=0.5, high=1.0,
         coarse=(0.25, 0.3125, 0.375, 0.4375, 0.5, 0.625, 0.75, 1.0),
         meaning="a row-wise-scaled FP8 GEMM's efficiency relative to the per-tensor FP8 GEMM's",
         informed_by=lambda precision, recipe: precision is Precision.FP8 and recipe is Fp8Recipe.ROWWISE),
)
SHARE, FP8, ROWWISE = KNOBS
FINE_STEP = 0.01  # the resolution the fitted knobs are reported at


@dataclass(frozen=True, kw_only=True)
class Run:
    """One measured run and its prediction at every point of the knobs' coarse grid."""

    id: str
    source: str        # the publication (source_key): what `--cv source` holds out
    gpu: str           # the GPU preset the run was measured on
    family: str        # its architecture (GPUSpec.architecture; the preset's name if none)
    moe: bool
    precision: Precision
    recipe: Fp8Recipe
    measured: float
    # predicted metric over (SHARE.coarse, FP8.coarse); a row-wise run's over (SHARE.coarse,
    # ROWWISE.coarse), the product of the two FP8 ratios
    grid: np.ndarray

    @property
    def ratio_axis(self) -> tuple[float, ...]:
        return ROWWISE.coarse if ROWWISE.informed_by(self.precision, self.recipe) else FP8.coarse

    def informs(self, knob: Knob) -> bool:
        return knob.informed_by(self.precision, self.recipe)

    def standard_grid(self) -> np.ndarray:
        """The grid over (SHARE.coarse, FP8.coarse): a row-wise run's at a row-wise ratio of 1."""
        if self.ratio_axis == FP8.coarse:
            return self.grid
        return np.stack([np.interp(FP8.coarse, self.ratio_axis, row) for row in self.grid])


def source_key(source: str) -> str:
    """The publication a row comes from: a repository or a paper, without commit, file and
    table ("NVIDIA/dgxc-benchmarking@35a9aec:..." -> "NVIDIA/dgxc-benchmarking"); a web page
    by its site and first path segment ("docs.nvidia.com/nemo-framework")."""
    url = re.search(r"https?://([^/\s]+)/([^/\s]*)", source)
    if url:
        return f"{url.group(1)}/{url.group(2)}".rstrip("/")
    return re.split(r"[@:(;]", source, maxsplit=1)[0].strip() or source.strip()


def tabulate(paths: list[str], gpus: tuple[str, ...] | None = None, progress=None) -> tuple[list[Run], list[dict]]:
    """Every predictable training row of `paths` (measured on one of the GPU presets `gpus`,
    when given) predicted on the knobs' coarse grid; and the rows skipped, with the reason."""
    runs, skipped, todo = [], [], []
    for path in paths:
        for line, row in read_training_rows(path):
            todo.append((path, line, row))
    for i, (path, line, row) in enumerate(todo):
        try:
            run = _tabulate_row(path, line, row, gpus)
        except ParaplanError as exc:
            skipped.append({"id": row.get("id"), "source": row.get("source"), "skipped": str(exc)})
            run = None
        if run is not None:
            runs.append(run)
        if progress:
            progress(i + 1, len(todo))
    return runs, skipped


def _tabulate_row(path: str, line: int, row: dict, gpus: tuple[str, ...] | None) -> Run | None:
    out = row_result(row, path, line, METRICS)
    row_cells(row, path, line)
    if out["skipped"]:
        raise SpecError(f"{path}:{line}", "metric_id", out["metric_id"], "a training metric")
    if out["metric_id"].endswith("_gib"):
        return None  # memory rows say nothing about compute knobs
    setup = row_setup(row, path, line)
    cluster = row_cluster(setup)
    if gpus is not None and cluster.gpu.name not in gpus:
        return None
    precision, recipe = setup.workload.precision, setup.workload.fp8_recipe
    rowwise = ROWWISE.informed_by(precision, recipe)
    axis = ROWWISE.coarse if rowwise else FP8.coarse
    grid = np.empty((len(SHARE.coarse), len(axis)))
    ratio_matters = rowwise or FP8.informed_by(precision, recipe)
    for i, s in enumerate(SHARE.coarse):
        for j, f in enumerate(axis):
            if j and not ratio_matters:
                grid[i, j] = grid[i, 0]  # the knob does not touch this run
                continue
            c = replace(cluster, gpu=replace(cluster.gpu, **{SHARE.field: s, FP8.field: f, ROWWISE.field: 1.0}))
            grid[i, j] = predict_on(row, setup, c)[0]
    return Run(id=row["id"], source=source_key(row.get("source") or ""), gpu=cluster.gpu.name,
               family=cluster.gpu.architecture or cluster.gpu.name,
               moe=setup.model.is_moe, precision=precision, recipe=recipe, measured=out["measured"], grid=grid)


def _fine(knob: Knob) -> np.ndarray:
    return np.round(np.arange(knob.low, knob.high + FINE_STEP / 2, FINE_STEP), 6)


def _interpolated(runs: list[Run]) -> np.ndarray:
    """Each run's prediction on the fine grid: shape (runs, fine s, fine f), bilinear in the
    coarse grid."""
    s_fine, f_fine = _fine(SHARE), _fine(FP8)
    s_c, f_c = np.array(SHARE.coarse), np.array(FP8.coarse)
    grids = np.stack([r.standard_grid() for r in runs])  # (runs, S, F)
    along_s = np.stack([np.interp(s_fine, s_c, g[:, j]) for g in grids for j in range(len(f_c))])
    along_s = along_s.reshape(len(runs), len(f_c), len(s_fine)).transpose(0, 2, 1)  # (runs, s_fine, F)
    out = np.empty((len(runs), len(s_fine), len(f_fine)))
    for r in range(len(runs)):
        for i in range(len(s_fine)):
            out[r, i] = np.interp(f_fine, f_c, along_s[r, i])
    return out


def _abs_pct(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(100.0 * (pred - measured) / measured)


def fit_knobs(runs: list[Run], prior: dict[str, float], fine: np.ndarray | None = None) -> dict[str, float]:
    """The knob values (on the fine grid) with the least mean |error|, one knob at a time: the
    sustained compute share on the 16- and 32-bit runs, then the FP8 ratio on the per-tensor
    FP8 and NVFP4 runs at that share, then the row-wise ratio on the row-wise runs at both.
    Both first knobs scale an FP8 run's GEMMs alike, so FP8 runs alone cannot tell them apart:
    without a 16/32-bit run the share is fitted on the FP8 runs at the prior's ratio, which
    stays. A knob no run informs keeps its `prior` value; ties go to the value nearest the prior."""
    fine = _interpolated(runs) if fine is None and runs else fine
    values = dict(prior)
    s_fine, f_fine = _fine(SHARE), _fine(FP8)
    f_prior = int(np.argmin(np.abs(f_fine - np.clip(prior[FP8.field], FP8.low, FP8.high))))
    measured = np.array([r.measured for r in runs])
    wide = np.array([r.informs(SHARE) for r in runs], bool)
    low = np.array([r.informs(FP8) for r in runs], bool)
    share_runs = wide if wide.any() else low
    if share_runs.any():
        err = _abs_pct(fine[share_runs, :, f_prior], measured[share_runs, None]).mean(axis=0)
        values[SHARE.field] = float(s_fine[_argmin_near(err, s_fine, prior[SHARE.field])])
    if wide.any() and low.any():
        s_index = int(np.argmin(np.abs(s_fine - np.clip(values[SHARE.field], SHARE.low, SHARE.high))))
        err = _abs_pct(fine[low, s_index, :], measured[low, None]).mean(axis=0)
        values[FP8.field] = float(f_fine[_argmin_near(err, f_fine, prior[FP8.field])])
    rowwise = [r for r in runs if r.informs(ROWWISE)]
    if rowwise:
        r_fine = _fine(ROWWISE)
        err = np.mean([[abs(100.0 * (predict_at(r, {**values, ROWWISE.field: x}) - r.measured) / r.measured)
                        for x in r_fine] for r in rowwise], axis=0)
        values[ROWWISE.field] = float(r_fine[_argmin_near(err, r_fine, prior[ROWWISE.field])])
    return values


def _argmin_near(err: np.ndarray, grid: np.ndarray, prior: float) -> int:
    """The grid index of the least error (to 1e-9), the one nearest `prior` among ties."""
    return int(np.lexsort((np.abs(grid - prior), np.round(err, 9)))[0])


def predict_at(run: Run, values: dict[str, float]) -> float:
    """The run's prediction at knob values inside the bounds (bilinear in the coarse grid; a
    row-wise run's at the product of the two FP8 ratios)."""
    s_c, f_c = np.array(SHARE.coarse), np.array(run.ratio_axis)
    s = float(np.clip(values[SHARE.field], SHARE.low, SHARE.high))
    f = float(np.clip(values[FP8.field], FP8.low, FP8.high))
    if run.informs(ROWWISE):
        f *= float(np.clip(values[ROWWISE.field], ROWWISE.low, ROWWISE.high))
    along_s = [np.interp(s, s_c, run.grid[:, j]) for j in range(len(f_c))]
    return float(np.interp(f, f_c, along_s))


def prior_knobs(gpu: GPUSpec) -> dict[str, float]:
    return {k.field: float(getattr(gpu, k.field)) for k in KNOBS}


@dataclass(frozen=True, kw_only=True)
class FitResult:
    gpu: str
    values: dict[str, float]
    prior: dict[str, float]
    runs: list[Run]
    in_sample: list[float]        # each run predicted by the fit on all runs
    leave_one_out: list[float]    # each run predicted by a fit without it
    skipped: list[dict]

    def mean_abs_pct(self, predictions: list[float]) -> float | None:
        if not self.runs:
            return None
        return float(np.mean([abs(100.0 * (p - r.measured) / r.measured) for p, r in zip(predictions, self.runs)]))


def fit_gpu(paths: list[str], gpu: GPUSpec, progress=None, pooled: tuple[GPUSpec, ...] = ()) -> FitResult:
    """Fit `gpu`'s knobs to the runs of `paths` measured on it (and on the `pooled` GPUs: one
    set of knobs for a family whose GPUs have few runs each)."""
    names = (gpu.name,) + tuple(g.name for g in pooled)
    runs, skipped = tabulate(paths, names, progress)
    prior = prior_knobs(gpu)
    if not runs:
        raise SpecError("fit", "--gpu", ",".join(names), f"a GPU some predictable row of {', '.join(paths)} was "
                        "measured on (no row names it)")
    fine = _interpolated(runs)
    values = fit_knobs(runs, prior, fine)
    keep = np.ones(len(runs), bool)
    loo = []
    for i, run in enumerate(runs):
        keep[i] = False
        others = [r for r, k in zip(runs, keep) if k]
        loo.append(predict_at(run, fit_knobs(others, prior, fine[keep]) if others else prior))
        keep[i] = True
    return FitResult(gpu=gpu.name, values=values, prior=prior, runs=runs,
                     in_sample=[predict_at(r, values) for r in runs], leave_one_out=loo, skipped=skipped)


# what a fit knows without runs: the microbenchmark itself (each knob's upper bound)
NEUTRAL = {k.field: k.high for k in KNOBS}


def _fit_pool(group: list[Run], fine: np.ndarray, keep: np.ndarray, fallback: dict[str, float]) -> dict[str, float]:
    """Knobs fitted on group[keep]; a knob those runs do not inform takes `fallback`'s value."""
    chosen = [r for r, k in zip(group, keep) if k]
    return fit_knobs(chosen, fallback, fine[keep]) if chosen else dict(fallback)


# fewer runs than this of one GPU type fit its family's knobs instead of their own: two runs
# of one source (the H200's, the B300's) say more about that source than about the GPU
MIN_RUNS = 5


def cross_validate_sources(runs: list[Run]) -> list[dict]:
    """Per run, in order: the prediction of knobs fitted on every run of its GPU (in sample)
    and of knobs fitted on its GPU's runs from every other source (out of source). A GPU with
    fewer than MIN_RUNS such runs is fitted on its architecture's (Run.family: a GPU whose
    held-out source is the only one that measured it borrows the knobs of its family's other
    GPUs, fitted on the other sources; Blackwell Ultra's power and clock behaviour is
    Blackwell's, the H200 is the H100's die); a knob none of them
    informs is the microbenchmark's (NEUTRAL). No value fitted on the held-out source is used."""
    out: list[dict] = [{} for _ in runs]
    fine = _interpolated(runs) if runs else np.empty((0,))
    family = np.array([r.family for r in runs])
    gpu = np.array([r.gpu for r in runs])
    family_of = {r.gpu: r.family for r in runs}
    source = np.array([r.source for r in runs])

    def pooled(g: str, allowed: np.ndarray) -> dict[str, float]:
        kin = (family == family_of[g]) & allowed
        knobs = _fit_pool(runs, fine, kin, NEUTRAL)
        mine = (gpu == g) & allowed
        return _fit_pool(runs, fine, mine, knobs) if mine.sum() >= MIN_RUNS else knobs

    for g in sorted(set(gpu)):
        everything = pooled(g, np.ones(len(runs), bool))
        for held in sorted(set(source[gpu == g])):
            knobs = pooled(g, source != held)
            for i in np.flatnonzero((gpu == g) & (source == held)):
                out[i] = {"in_sample": predict_at(runs[i], everything), "out_of_source": predict_at(runs[i], knobs),
                          "knobs_in_sample": everything, "knobs_out_of_source": knobs}
    return out


def profile_toml(result: FitResult, cluster_preset: str, command: str) -> str:
    """A hardware profile for `--hardware`: the GPU's reference cluster preset with the GPU
    inline and the fitted knobs set, its header saying how they were fitted."""
    import tomllib

    import tomli_w

    from ..specs.catalog import CATALOG_DIR
    cluster = tomllib.loads((CATALOG_DIR / "clusters" / f"{cluster_preset}.toml").read_text(encoding="utf-8"))
    gpu = tomllib.loads((CATALOG_DIR / "gpus" / f"{result.gpu}.toml").read_text(encoding="utf-8"))
    gpu.update({k: round(v, 6) for k, v in result.values.items()})
    gpu.pop("aliases", None)
    cluster.pop("aliases", None)
    cluster["name"] = f"{cluster_preset}-fitted"
    cluster["gpu"] = gpu
    errors = (f"in-sample mean |error| {result.mean_abs_pct(result.in_sample):.2f}%, leave-one-out "
              f"{result.mean_abs_pct(result.leave_one_out):.2f}% over {len(result.runs)} runs")
    cluster["source"] = f"{cluster.get('source', cluster_preset)}; knobs fitted by `{command}` ({errors})"
    header = [f"# Written by `{command}`.",
              f"# {result.gpu} knobs fitted to {len(result.runs)} measured runs ({errors}):"]
    header += [f"#   {k.field} = {result.values[k.field]:.2f} (preset {result.prior[k.field]:.2f}; bounds "
               f"{k.low}-{k.high}): {k.meaning}" for k in KNOBS]
    header += ["# Runs: " + ", ".join(r.id for r in result.runs)]
    return "\n".join(header) + "\n\n" + tomli_w.dumps(cluster)
