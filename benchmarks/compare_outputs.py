"""Check that a change leaves paraplan's answers untouched: every `validate` number, the
ranked top 10 of a set of searches, estimates, serving and embedding plans, and every
exported file, compared against another commit's (by default the parent, HEAD~1).

    python benchmarks/compare_outputs.py                 # this tree against HEAD~1
    python benchmarks/compare_outputs.py --base main     # against another commit
    python benchmarks/compare_outputs.py --quick         # skip the slow cases (MoE search, --cv)
    python benchmarks/compare_outputs.py --allow-new-keys  # JSON that only gained fields is unchanged

The base commit is checked out in a temporary git worktree; both trees run the same
commands with the same interpreter (`python -m paraplan`, PYTHONPATH pointing at each tree's
`src/`). JSON outputs are compared after dropping wall-clock fields (`elapsed_s`, `search_s`),
with the output folder's path replaced by `{out}`; files are compared byte for byte. A base
commit's results are kept in $TMPDIR/paraplan-compare-cache/ by the hash of its src/ tree, so a second
comparison runs only this tree. Exit 0 when everything matches, 1 with the differing cases named.
Refactors (issue 32: "outputs must not change") are checked with this script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VALIDATION = os.path.join(os.path.dirname(REPO), "shared", "validation")
CACHE = os.path.join(tempfile.gettempdir(), "paraplan-compare-cache")  # base results by commit
WALL_CLOCK_KEYS = ("elapsed_s", "search_s")

TRAINING_FILES = ("training_dev.csv", "training_dev_more.csv", "training_dev_moe.csv")
INFERENCE_FILES = ("inference_dev.csv", "inference_dev_more.csv")


def cases(quick: bool) -> list[tuple[str, list[str], list[str]]]:
    """(name, arguments, files the command writes under the output folder)."""
    training = [os.path.join(VALIDATION, f) for f in TRAINING_FILES]
    inference = [os.path.join(VALIDATION, f) for f in INFERENCE_FILES]
    out = [
        ("validate-training", ["validate", *training, "--json"], []),
        ("validate-inference", ["validate", *inference, "--json"], []),
        ("fit-h100", ["fit", *training, "--gpu", "H100", "--json"], []),
        ("search-default", ["search", "--json"], []),
        ("search-gpt3", ["search", "--model", "gpt3-175b", "--gpus", "1024", "--seq", "2048",
                         "--batch", "1536", "--json"], []),
        ("search-torchtitan", ["search", "--engine", "torchtitan", "--json"], []),
        ("search-megatron-405b", ["search", "--engine", "megatron", "--model", "llama3.1-405b",
                                  "--gpus", "2048", "--json"], []),
        ("search-pinned-nofit", ["search", "--model", "llama3.1-405b", "--gpus", "64", "--pp", "1",
                                 "--cp", "1", "--json"], []),
        ("estimate-default", ["estimate", "--json"], []),
        ("estimate-405b", ["estimate", "--model", "llama3.1-405b", "--gpus", "16384", "--seq", "8192",
                           "--batch", "2048", "--tp", "8", "--pp", "16", "--vp", "8", "--dp", "128",
                           "--zero", "1", "--recompute", "first_k", "--recompute-layers", "2",
                           "--tokens", "15.6e12", "--json"], []),
        ("estimate-nofit", ["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--dp", "8",
                            "--seq", "8192", "--batch", "64", "--mb", "2", "--json"], []),
        ("estimate-moe", ["estimate", "--model", "deepseek-v3", "--gpus", "1024", "--precision", "fp8",
                          "--seq", "4096", "--batch", "8192", "--tp", "1", "--pp", "16", "--ep", "64",
                          "--dp", "64", "--json"], []),
        ("trace-default", ["trace", "-o", "{out}/trace.json"], ["trace.json"]),
        ("scale", ["scale", "--counts", "256,1024,4096", "--json"], []),
        ("serve", ["serve", "--json"], []),
        ("serve-moe", ["serve", "--model", "deepseek-v3", "--cluster", "dgx-h200", "--json"], []),
        ("embeddings", ["embeddings", "--json"], []),
        ("presets", ["presets", "--json"], []),
    ]
    for engine, name in (("torchtitan", "job.toml"), ("megatron", "train.sh"), ("deepspeed", "ds.json")):
        out.append((f"export-{engine}", ["export", "--format", engine, "-o", f"{{out}}/{name}"], [name]))
        out.append((f"export-{engine}-plan",
                    ["export", "--format", engine, "--tp", "4", "--pp", "4", "--dp", "32", "--mb", "1",
                     "-o", f"{{out}}/plan-{name}"], [f"plan-{name}"]))
    out.append(("export-megatron-moe",
                ["export", "--format", "megatron", "--model", "deepseek-v3", "--gpus", "1024", "--precision",
                 "fp8", "--seq", "4096", "--batch", "8192", "-o", "{out}/moe.sh"], ["moe.sh"]))
    if not quick:
        out.append(("search-moe", ["search", "--model", "deepseek-v3", "--gpus", "1024", "--precision", "fp8",
                                   "--seq", "4096", "--batch", "8192", "--json"], []))
        out.append(("validate-cv", ["validate", *training, "--cv", "source", "--json"], []))
    return out


def without_wall_clock(value):
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if k not in WALL_CLOCK_KEYS}
    if isinstance(value, list):
        return [without_wall_clock(v) for v in value]
    return value


def run_tree(src: str, out_dir: str, quick: bool) -> dict[str, dict]:
    """Run every case with `src` first on the path; {case: {"rc", "stdout", "stderr", files...}}."""
    env = dict(os.environ, PYTHONPATH=src, COLUMNS="120")
    results = {}
    for name, args, files in cases(quick):
        case_dir = os.path.join(out_dir, name)
        os.makedirs(case_dir, exist_ok=True)
        argv = [a.replace("{out}", case_dir) for a in args]
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "paraplan", *argv], env=env, capture_output=True,
                              text=True, cwd=out_dir)
        wall_s = time.perf_counter() - start
        stdout = done.stdout.replace(case_dir, "{out}")
        if "--json" in argv and stdout.strip():
            try:
                stdout = json.dumps(without_wall_clock(json.loads(stdout)), sort_keys=True, indent=1)
            except json.JSONDecodeError:
                pass
        result = {"rc": done.returncode, "stdout": stdout,
                  "stderr": done.stderr.replace(case_dir, "{out}")}
        for f in files:
            path = os.path.join(case_dir, f)
            result[f] = open(path, "rb").read().replace(case_dir.encode(), b"{out}") if os.path.exists(path) \
                else None
        results[name] = result
        print(f"  {name}: exit {done.returncode}, {wall_s:.1f} s", file=sys.stderr)
    return results


def without_new_keys(this, base):
    """`this` JSON value without the object keys `base` lacks (an output that only gained
    fields, such as a new breakdown line at 0, compares equal: --allow-new-keys)."""
    if isinstance(this, dict) and isinstance(base, dict):
        return {k: without_new_keys(v, base[k]) for k, v in this.items() if k in base}
    if isinstance(this, list) and isinstance(base, list) and len(this) == len(base):
        return [without_new_keys(x, y) for x, y in zip(this, base)]
    return this


def same_json_but_new_keys(base_text, this_text) -> bool:
    try:
        base, this = json.loads(base_text), json.loads(this_text)
    except (TypeError, json.JSONDecodeError):
        return False
    return without_new_keys(this, base) == base


def first_difference(a, b) -> str:
    a_lines, b_lines = str(a).splitlines(), str(b).splitlines()
    for i, (x, y) in enumerate(zip(a_lines, b_lines)):
        if x != y:
            return f"line {i + 1}: base {x[:160]!r} / this {y[:160]!r}"
    return f"base has {len(a_lines)} lines, this tree {len(b_lines)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="commit to compare against (default HEAD~1)")
    parser.add_argument("--quick", action="store_true", help="skip the MoE search and --cv source")
    parser.add_argument("--allow-new-keys", action="store_true",
                        help="a JSON output that only gained keys the base lacks counts as unchanged")
    args = parser.parse_args()
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", args.base], check=True, capture_output=True,
                         text=True).stdout.strip()
    # Keyed by the base's src/ tree and the cases run: commits that touch only tests or docs share it.
    src_tree = subprocess.run(["git", "-C", REPO, "rev-parse", f"{sha}:src"], check=True, capture_output=True,
                              text=True).stdout.strip()
    cases_key = hashlib.sha1(repr(cases(False)).encode()).hexdigest()[:10]
    cache = os.path.join(CACHE, f"{src_tree}-{cases_key}{'-quick' if args.quick else ''}.pickle")
    work = tempfile.mkdtemp(prefix="paraplan-compare.")
    base_tree = os.path.join(work, "base")
    try:
        full_cache = os.path.join(CACHE, f"{src_tree}-{cases_key}.pickle")  # the full set holds the quick one
        if os.path.exists(cache) or os.path.exists(full_cache):
            found = cache if os.path.exists(cache) else full_cache
            print(f"base {args.base} ({sha[:10]}): from {found}", file=sys.stderr)
            with open(found, "rb") as f:
                base = pickle.load(f)
            names = {name for name, _, _ in cases(args.quick)}
            base = {name: result for name, result in base.items() if name in names}
        else:
            subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", base_tree, sha], check=True,
                           capture_output=True)
            print(f"base {args.base} ({sha[:10]}):", file=sys.stderr)
            base = run_tree(os.path.join(base_tree, "src"), os.path.join(work, "base-out"), args.quick)
            os.makedirs(CACHE, exist_ok=True)
            with open(cache, "wb") as f:
                pickle.dump(base, f)
        print("this tree:", file=sys.stderr)
        this = run_tree(os.path.join(REPO, "src"), os.path.join(work, "this-out"), args.quick)
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", base_tree], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    differing = []
    for name in base:
        for key in base[name]:
            if base[name][key] != this[name][key] and not (
                    args.allow_new_keys and key == "stdout" and same_json_but_new_keys(base[name][key], this[name][key])):
                differing.append(f"{name} {key}: {first_difference(base[name][key], this[name][key])}")
    for line in differing:
        print(line)
    print(f"{len(base)} cases, {len(differing)} differences against {args.base}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
