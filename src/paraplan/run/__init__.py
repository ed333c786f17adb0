"""Execute a plan on PyTorch distributed and measure it (`paraplan run`).

torch is imported only by the worker modules (model, tensor_parallel, data_parallel,
pipeline, checkpointing, measure, worker); config, report and cli need only paraplan, so
`paraplan --help` and `paraplan compare` work without torch installed.
"""
