"""Pictures (matplotlib, the optional `plot` extra): the path check, the import and the
write that every plot shares, and the scaling sweep's plot. matplotlib is imported only
when a plot is drawn."""

from __future__ import annotations

import io
from pathlib import Path

from ..errors import ParaplanError, SpecError
from ..units import SECONDS_PER_DAY

# The step's parts (TimeBreakdown fields) as the scaling plot stacks them: every one, once
# (tests/test_scale.py checks), so that each bar reaches the step
STEP_PART_GROUPS = {"compute": ("compute_s",), "recompute": ("recompute_s",),
                    "exposed comm.": ("tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "offload_s"),
                    "bubble": ("bubble_s",), "optimizer": ("optimizer_s",), "waiting for the host": ("host_wait_s",),
                    "work in the bubbles (exposed)": ("bubble_work_s",)}

# what --plot writes, by extension (matplotlib's own writers, none needing LaTeX or more);
# no extension: PNG, at exactly the path given
PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


def plot_format(path: str, command: str) -> str:
    """The image format `path` asks for, or a one-line error listing the allowed extensions."""
    from ..outfile import check_output
    check_output(path, command, "--plot")
    ext = Path(path).suffix.lower().removeprefix(".")
    if Path(path).suffix and ext not in PLOT_FORMATS:
        raise SpecError(command, "--plot", path, "allowed extensions: "
                        + ", ".join(f".{f}" for f in PLOT_FORMATS) + " (none: PNG)")
    return ext or "png"


def pyplot(command: str):
    """matplotlib.pyplot on the file-only Agg backend, or a one-line error naming the extra."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ParaplanError(f"{command}: --plot needs matplotlib (pip install 'paraplan[plot]')") from None
    return plt


def save_figure(fig, path: str, command: str) -> None:
    """Write `fig` whole at `path` in the format of its extension (PNG without one)."""
    from ..outfile import write_output
    fmt = plot_format(path, command)
    plt = pyplot(command)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=120)  # format given: the file is `path`, never path + ".png"
    finally:
        plt.close(fig)
    write_output(path, buf.getvalue(), command, "--plot")


def plot_scaling(result, path: str, title: str) -> None:
    """Two panels over the GPU counts of a sweep (search/scaling.py): where the best plan's
    step goes (shares of the step, MFU on top); and days to train the budget against its
    dollars, each point labelled with its GPU count (interruptions included)."""
    plt = pyplot("scale")
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    pts = result.planned
    if not pts:
        raise ParaplanError("scale: --plot: no GPU count has a plan to draw")
    many = len(result.cluster_names) > 1  # several clusters: each bar and point names its own
    labels = [f"{p.num_gpus:,}" + (f"\n{p.cluster_name}" if many else "") for p in pts]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    bottom = [0.0] * len(pts)
    for name, fields in STEP_PART_GROUPS.items():
        share = [100 * sum(getattr(p.best.time, f) for f in fields) / p.best.step_time_s for p in pts]
        ax1.bar(labels, share, bottom=bottom, label=name)
        bottom = [b + x for b, x in zip(bottom, share)]
    for i, p in enumerate(pts):
        ax1.annotate(f"MFU {100 * p.best.mfu:.0f}%", (i, 100), fontsize=7, ha="center", xytext=(0, 3),
                     textcoords="offset points")
    ax1.set_ylim(0, 112)
    ax1.set_xlabel("GPUs" + (" and cluster" if many else ""))
    if many:
        ax1.tick_params(axis="x", labelsize=6)
    ax1.set_ylabel("share of the best plan's step (%)")
    ax1.legend(fontsize=7, loc="lower left")
    for name in result.cluster_names:
        mine = [p for p in pts if p.cluster_name == name]
        days = [p.best.budget.with_failures.wall_time_s / SECONDS_PER_DAY for p in mine]
        usd = [p.best.budget.with_failures.wall_usd for p in mine]
        ax2.plot(days, usd, marker="o", label=name if many else None)
        for x, y, p in zip(days, usd, mine):
            ax2.annotate(f"{p.num_gpus:,}", (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    if many:
        ax2.legend(fontsize=7)
    ax2.set_xscale("log")
    ax2.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax2.xaxis.set_major_formatter(ScalarFormatter())
    ax2.xaxis.set_minor_formatter(NullFormatter())
    ax2.set_xlabel("days to train the token budget (with interruptions)")
    ax2.set_ylabel("cost ($, with interruptions)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, "scale")
