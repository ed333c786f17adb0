"""What calibration/gpu_*.py share: CUDA-event timing of back-to-back calls, and a results
file under $OUT rewritten after every row (a run stopped at its time limit keeps its rows).
Torch only: the GPU machine needs no paraplan install for these."""
import json
import os
import statistics

import torch


def timed(fn, reps: int = 10, runs: int = 5, warmup: int = 3) -> float:
    """Seconds per call of `fn`: the median over `runs` of `reps` calls issued back to back
    between two CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3 / reps)
    return statistics.median(out)


def results(name: str) -> dict:
    """A results record for $OUT/`name` (the device and torch named); add rows with add_row."""
    return {"file": os.path.join(os.environ.get("OUT", "/tmp"), name), "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "rows": []}


def add_row(res: dict, row: dict) -> None:
    """Print the row, keep it, free the cached memory, and rewrite the results file."""
    print(json.dumps(row), flush=True)
    res["rows"].append(row)
    torch.cuda.empty_cache()
    with open(res["file"], "w") as fh:
        json.dump({k: v for k, v in res.items() if k != "file"}, fh, indent=1)
