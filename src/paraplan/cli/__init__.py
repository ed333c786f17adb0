"""paraplan command line: search, scale, estimate, trace, validate, embeddings, presets (one
module each), and fit, serve, export, calibrate, run, compare (in their packages' cli.py);
args.py holds the flags the training commands share and what they make.

User mistakes print one line on stderr and exit 2; nothing is written on failure.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
