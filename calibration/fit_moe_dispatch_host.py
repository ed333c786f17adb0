"""Fit the host time Megatron-Core spends issuing one MoE layer's forward between two dropless
dispatch synchronizations (GPUSpec.moe_dispatch_host_s; cost/stages.py moe_dispatch_wait)
against every published mixture-of-experts training run, and report how well a value fitted
without one publication predicts that publication's runs (leave one source out):

    python calibration/fit_moe_dispatch_host.py > calibration/fit_moe_dispatch_host.out

One value for every GPU preset (the host's issue rate is the engine's Python and CUDA launch
path, not the GPU's), on a grid of 0.25 ms from 0 to 6 ms; never per row or source. Each run
is predicted as `paraplan validate` predicts it (the best plan for its blank knobs), with the
presets' other knobs as they are. About 10 minutes on 2 cores.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

import numpy as np

import paraplan.validate.training as vt
from paraplan.errors import ParaplanError
from paraplan.validate.fit import source_key

FILES = ("training_dev.csv", "training_dev_more.csv", "training_dev_moe.csv")
GRID_MS = tuple(0.25 * i for i in range(25))
_row_cluster = vt.row_cluster


def _moe_rows(folder: Path) -> list[tuple[str, int, dict]]:
    out = []
    for name in FILES:
        for line, row in vt.read_training_rows(str(folder / name)):
            if (row.get("num_experts") or "").strip() not in ("", "0", "1"):
                out.append((str(folder / name), line, row))
    return out


def _errors_at(args) -> list[float | None]:
    """Signed % error of every MoE row at one host time (None: the row is skipped)."""
    host_ms, rows = args

    def cluster(setup):
        c = _row_cluster(setup)
        return replace(c, gpu=replace(c.gpu, moe_dispatch_host_s=host_ms * 1e-3))
    vt.row_cluster = cluster
    out = []
    for path, line, row in rows:
        try:
            res = vt.predict_row(row, path, line)
        except ParaplanError:  # a row `validate` skips with its reason (e.g. no global batch)
            out.append(None)
            continue
        out.append(None if res["skipped"] or res["error_pct"] is None else res["error_pct"])
    return out


def main(folder: str) -> None:
    rows = _moe_rows(Path(folder))
    with Pool(2) as pool:
        table = pool.map(_errors_at, [(h, rows) for h in GRID_MS])
    keep = [i for i in range(len(rows)) if all(t[i] is not None for t in table)]
    err = np.array([[abs(t[i]) for i in keep] for t in table])  # grid × rows
    sources = np.array([source_key(rows[i][2]["source"]) for i in keep])
    print(f"{len(keep)} MoE runs ({len(rows) - len(keep)} skipped); mean |error| % by host time per MoE layer forward:")
    for h, e in zip(GRID_MS, err):
        print(f"  {h:5.2f} ms  mean {e.mean():5.1f}  max {e.max():6.1f}")
    best = int(np.argmin(err.mean(axis=1)))
    print(f"fitted: {GRID_MS[best]:.2f} ms (in-sample mean {err[best].mean():.1f}%, at 0 ms {err[0].mean():.1f}%)")
    print("leave one source out (fit on the others, predict it):")
    held = np.zeros(len(keep))
    for src in sorted(set(sources)):
        out = sources == src
        h = int(np.argmin(err[:, ~out].mean(axis=1))) if np.any(~out) else 0
        held[out] = err[h, out]
        print(f"  {src:40s} {int(out.sum()):3d} runs  fitted without it {GRID_MS[h]:.2f} ms  "
              f"its mean {err[h, out].mean():5.1f}% (in-sample {err[best, out].mean():5.1f}%, at 0 ms {err[0, out].mean():5.1f}%)")
    print(f"out-of-source mean {held.mean():.1f}%")
    print("per run at the fitted value (signed %):")
    ids = [rows[i][2]["id"] for i in keep]
    for j, i in enumerate(keep):
        r = rows[i][2]
        print(f"  {ids[j]:22s} {r['gpu'][:12]:12s} {r['model'][:20]:20s} mb {r['micro_batch']:>2s}  "
              f"{table[0][i]:+7.1f} -> {table[best][i]:+7.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[2] / "shared" / "validation"))
