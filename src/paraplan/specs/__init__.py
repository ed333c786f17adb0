"""Specs: what is trained (model), on what (cluster), and how much (workload)."""
