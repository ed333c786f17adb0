"""paraplan: predict, search and rank parallel training plans for transformers."""

__version__ = "0.1.0"
