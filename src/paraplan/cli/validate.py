"""`paraplan validate`: predict every row of published-measurements CSVs."""

from __future__ import annotations

import sys

from ..argtypes import non_empty as _non_empty
from ..errors import SpecError
from ..report.strict_json import json_text
from .progress import show_progress


def add_parser(sub) -> None:
    v = sub.add_parser("validate", help="predict every row of published-measurements CSVs")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument("--cv", choices=["source"], default=None,
                   help="source: fit each GPU's knobs on every source but one and predict that one, for every "
                        "source; report in-sample and out-of-source error (training files)")
    v.add_argument("--json", action="store_true")
    v.add_argument("--verbose", action="store_true", help="show the chosen values of blank knobs")
    v.add_argument("--hardware", default=None, type=_non_empty, help="predict every row on this profile TOML or cluster preset "
                                                     "(e.g. from paraplan calibrate) instead of the row's GPU")
    v.set_defaults(func=cmd_validate)


def cmd_validate(args) -> int:
    from ..validate.inference import is_inference_file, validate_inference_file
    from ..validate.report import render_validation
    from ..validate.rows import summarize
    from ..validate.training import validate_file
    if args.cv:
        return _cross_validate(args)
    kw = {}
    if args.hardware:  # a bad profile is one line before any row is predicted
        from ..specs.catalog import load_flag_cluster
        if any(is_inference_file(f) for f in args.files):
            raise SpecError("validate", "--hardware", args.hardware, "only training-measurement files take a profile")
        load_flag_cluster("validate", "--hardware", args.hardware)
        kw["hardware"] = args.hardware
    progress = show_progress if (not args.json and sys.stderr.isatty()) else None
    results = [(validate_inference_file(f, progress=progress) if is_inference_file(f)
                else validate_file(f, progress=progress, **kw)) for f in args.files]
    rows = [r for res in results for r in res["rows"]]
    result = results[0] if len(results) == 1 else {"rows": rows, "summary": summarize(rows)}
    if args.json:
        print(json_text(result, indent=1))
    else:
        print(render_validation(result, verbose=args.verbose))
    summary = result["summary"]
    if summary["n_predicted"] == 0:  # a summary of nothing must not read as a pass: exit 1
        sys.stderr.write(f"paraplan: error: no row of {', '.join(args.files)} could be predicted "
                         f"({summary['n_skipped']} skipped: each row above says why)\n")
        return 1
    return 0


def _cross_validate(args) -> int:
    """validate --cv source: knobs fitted per GPU on every source but one, that one predicted."""
    from ..validate.cli import cross_validation, render_cross_validation
    from ..validate.inference import is_inference_file
    for f in args.files:
        if is_inference_file(f):
            raise SpecError("validate", "--cv", args.cv, f"applies to training files; {f} holds inference runs")
    if args.hardware:
        raise SpecError("validate", "--hardware", args.hardware, "not with --cv (which fits the presets' knobs)")
    result = cross_validation(args.files)
    print(json_text(result, indent=1) if args.json else render_cross_validation(result))
    return 0 if result["rows"] else 1
