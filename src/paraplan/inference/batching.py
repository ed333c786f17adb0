"""Event simulation of iteration-level (continuous) batching on one replica.

Orca (Yu et al. OSDI'22) schedules per iteration: every iteration runs the prompts being
prefilled and one token of every decoding sequence together; a finished sequence leaves
and a waiting one joins at the next iteration. Admission (TensorRT-LLM's default
GUARANTEED_NO_EVICT policy, vLLM without preemption) is first-come first-served while
the batch has fewer than `max_batch` sequences and the KV cache can hold the newcomer's
whole prompt + output (rounded up to KV pages). Each iteration carries at most
`max_num_tokens` tokens, decode tokens included; a prompt longer than the budget they leave
is not admitted until it fits whole (TensorRT-LLM's scheduler without chunked context),
unless chunked prefill (Sarathi, Agrawal et al. 2023) splits it to fill the budget. Prompts
longer than `max_num_tokens` are always chunked, one at a time.

The loop is event-driven: the clock jumps from one iteration's end to the next, or to the
next arrival when the replica is idle; iteration times come from step.IterationModel. No
I/O; one tie-break rule: requests are served in arrival order (ties by request index).

Arrivals: at a rate λ, N arrival times are N sorted uniform draws on [0, N/λ] — a Poisson
process conditioned on N arrivals in that window, so the offered load is exactly λ and the
bursts are Poisson's. Maximum load: all N arrive at time 0. Concurrency c: a closed loop in
which each finished request is replaced at once, until N have been sent.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import ParaplanError
from .deploy import EngineLimits, Traffic
from .step import AttentionWindow, IterationModel

KV_PAGE_TOKENS = 64  # tokens per KV-cache page (TensorRT-LLM tokens_per_block default: 64)


def has_tpot(output_tokens: int) -> bool:
    """Whether a request of `output_tokens` output tokens has a TPOT, (finish − first token) / (n − 1):
    a single output token has no second one."""
    return output_tokens > 1


@dataclass(frozen=True, kw_only=True)
class ServingResult:
    ttft_s: np.ndarray        # per request
    tpot_s: np.ndarray        # per request with > 1 output token: (finish − first token) / (n − 1)
    e2e_s: np.ndarray
    makespan_s: float         # first arrival to last completion
    num_iterations: int
    output_tokens: int
    prompt_tokens: int
    max_concurrency: int      # most sequences in one iteration
    kv_capacity_tokens: int

    @property
    def num_requests(self) -> int:
        return len(self.e2e_s)

    @property
    def has_tpot(self) -> bool:
        """Whether tpot_s holds one value per request (every request has output_tokens / num_requests)."""
        return has_tpot(self.output_tokens // self.num_requests)

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.makespan_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.output_tokens + self.prompt_tokens) / self.makespan_s

    def percentile(self, name: str, q: float) -> float:
        values = getattr(self, name)
        return float(np.percentile(values, q)) if len(values) else 0.0

    def goodput_rps(self, ttft_target_s: float | None, tpot_target_s: float | None) -> float:
        """Requests per second that met both latency targets (DistServe's goodput)."""
        ok = np.ones(self.num_requests, dtype=bool)
        if ttft_target_s is not None:
            ok &= self.ttft_s <= ttft_target_s
        if tpot_target_s is not None and self.has_tpot:
            ok &= self.tpot_s <= tpot_target_s
        return float(ok.sum()) / self.makespan_s


def _decode_run(decoding_finish: list, reaching: deque, it: int) -> int:
    """Iterations from `it` on after which no decoding sequence finishes or reaches the window
    (some sequence is decoding: `decoding_finish` is not empty)."""
    event = decoding_finish[0][0]
    if reaching:
        event = min(event, reaching[0])
    return event - 1 - it


def arrival_times_s(traffic: Traffic, seed: int = 0) -> np.ndarray:
    n = traffic.num_requests
    if traffic.rate_rps is None:
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    return np.sort(rng.uniform(0.0, n / traffic.rate_rps, size=n))


def simulate(step: IterationModel, traffic: Traffic, limits: EngineLimits, kv_capacity_tokens: int,
             seed: int = 0, *, decode_runs: bool = True) -> ServingResult:
    """Serve `traffic` on one replica; returns per-request latencies and throughput.
    `decode_runs`: time a run of decode-only iterations at once (the same result, one
    iteration at a time with False: tests/test_serving_speed.py compares the two)."""
    n = traffic.num_requests
    isl, osl = traffic.prompt_tokens, traffic.output_tokens
    window = AttentionWindow.of(step.model, limits.sliding_window_kv)
    need = window.held_paged(isl + osl, KV_PAGE_TOKENS)
    if need > kv_capacity_tokens:
        raise ParaplanError(
            f"one request needs {math.ceil(need)} tokens of KV cache but a replica holds {kv_capacity_tokens}; "
            "use more GPUs per replica (tp/pp), an fp8/int8 KV cache or shorter requests")
    closed = traffic.concurrency is not None
    if closed:
        arrivals = np.zeros(n)
        released = min(traffic.concurrency, n)
    else:
        arrivals = arrival_times_s(traffic, seed)
        released = n
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)

    waiting: deque[int] = deque()
    next_arrival = 0             # next request index not yet queued
    prefilling: list[list[int]] = []   # [request, prompt tokens done]
    decoding_finish: list[tuple[int, int]] = []   # heap of (iteration it finishes at, request)
    decode_start_ctx: dict[int, int] = {}
    num_decoding = 0
    ctx_sum = 0                  # KV tokens the decoding sequences read this iteration
    kv_reserved = 0.0
    # sliding-window layers read min(context, w) of a decoding sequence's tokens: their sum,
    # how many sequences are still below the window, and when each reaches it (every
    # sequence starts decoding at isl + 1 and lives osl − 1 iterations, so either all of
    # them reach the window before finishing or none does, in the order they started)
    w = window.window or (isl + osl + 1)
    win_sum = 0
    growing = 0
    iterations_to_window = w - isl - 1
    caps_while_decoding = 0 < iterations_to_window < osl - 1
    reaching: deque[int] = deque()   # iteration at which a growing sequence reaches w
    it = 0
    now = 0.0
    max_conc = 0
    budget_cap = limits.max_num_tokens

    def release_upto(t: float) -> None:
        nonlocal next_arrival
        while next_arrival < released and arrivals[next_arrival] <= t:
            waiting.append(next_arrival)
            next_arrival += 1

    done = 0
    while done < n:
        release_upto(now)
        active = len(prefilling) + num_decoding
        if active == 0 and not waiting:
            if next_arrival >= released:  # closed loop waiting on nothing: cannot happen
                break
            now = max(now, float(arrivals[next_arrival]))
            continue
        # admission, FCFS
        budget = budget_cap - num_decoding
        pending = sum(isl - d for _, d in prefilling)
        while waiting and active < limits.max_batch and kv_reserved + need <= kv_capacity_tokens:
            if limits.chunked_prefill:
                if pending >= budget:
                    break
            elif isl <= budget_cap:
                # a whole prompt in one iteration: it waits until the decode tokens leave it room
                if pending + isl > budget:
                    break
            elif prefilling:  # longer than any iteration: chunked, one prompt at a time
                break
            prefilling.append([waiting.popleft(), 0])
            pending += isl
            kv_reserved += need
            active += 1
        run = _decode_run(decoding_finish, reaching, it) if decode_runs and not prefilling and num_decoding else 0
        if run > 1:
            # Only decoding until the next event (a sequence finishing or reaching the window,
            # an arrival while admission is open): the iterations differ only in the KV they
            # read, so they are timed at once, each exactly as the loop below would time it.
            # Admission cannot change before the event: the batch, the KV reserved and the
            # token budget stay as they are.
            D = num_decoding
            k = np.arange(run)
            read = ((1.0 - window.share) * (ctx_sum + k * D + D)
                    + window.share * (win_sum + k * growing + growing))
            dts = step.time_s(0, 0.0, D, read, D, prefill_chunks=0, largest_chunk=0)
            starts = np.cumsum(np.concatenate(([now], dts)))  # sequential, as now += dt is
            runs = run
            if not waiting and next_arrival < released:  # the loop would admit it at once
                runs = max(1, int(np.searchsorted(starts[:runs], arrivals[next_arrival], side="left")))
            max_conc = max(max_conc, D)
            now = float(starts[runs])
            it += runs
            ctx_sum += D * runs
            win_sum += growing * runs
            continue
        # this iteration's prefill chunks
        P = 0
        pairs = 0.0
        chunks = largest = 0
        completing = []
        left = max(budget, 0)
        for entry in prefilling:
            if left <= 0:
                break
            r, d = entry
            c = min(isl - d, left)
            if c <= 0:
                continue
            P += c
            chunks += 1
            largest = max(largest, c)
            pairs += window.prefill_pairs(d, c)
            left -= c
            entry[1] = d + c
            if entry[1] >= isl:
                completing.append(r)
        D = num_decoding
        if P == 0 and D == 0:
            # nothing fits this iteration (cannot happen: with no decode tokens the whole
            # budget is free, and a prompt longer than it is chunked)
            raise AssertionError("serving simulation made no progress")
        max_conc = max(max_conc, len(prefilling) + D)
        read = (1.0 - window.share) * (ctx_sum + D) + window.share * (win_sum + growing)
        dt = step.time_s(P, pairs, D, read, D + len(completing), prefill_chunks=chunks, largest_chunk=largest)
        now += dt
        it += 1
        # decoding sequences each produced a token
        ctx_sum += D
        win_sum += growing
        while reaching and reaching[0] <= it:
            reaching.popleft()
            growing -= 1
        while decoding_finish and decoding_finish[0][0] <= it:
            _, r = heapq.heappop(decoding_finish)
            finish[r] = now
            num_decoding -= 1
            ctx_sum -= decode_start_ctx.pop(r) + (osl - 1)
            win_sum -= min(isl + osl, w)
            if isl + 1 < w and not caps_while_decoding:
                growing -= 1
            kv_reserved -= need
            done += 1
            if closed and released < n:
                arrivals[released] = now
                released += 1
        if completing:
            done_set = set(completing)
            prefilling = [e for e in prefilling if e[0] not in done_set]
            for r in completing:
                first[r] = now
                if osl == 1:
                    finish[r] = now
                    kv_reserved -= need
                    done += 1
                    if closed and released < n:
                        arrivals[released] = now
                        released += 1
                else:
                    heapq.heappush(decoding_finish, (it + osl - 1, r))
                    decode_start_ctx[r] = isl + 1
                    ctx_sum += isl + 1
                    win_sum += min(isl + 1, w)
                    if isl + 1 < w:
                        growing += 1
                        if caps_while_decoding:
                            reaching.append(it + iterations_to_window)
                    num_decoding += 1
    start = float(arrivals.min())
    ttft = first - arrivals
    tpot = (finish - first) / (osl - 1) if has_tpot(osl) else np.zeros(0)
    return ServingResult(ttft_s=ttft, tpot_s=tpot, e2e_s=finish - arrivals, makespan_s=float(np.nanmax(finish)) - start,
                         num_iterations=it, output_tokens=n * osl, prompt_tokens=n * isl,
                         max_concurrency=max_conc, kv_capacity_tokens=kv_capacity_tokens)
