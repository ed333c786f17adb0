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


class _Replica:
    """One replica's state as the simulation steps it: who waits, prefills and decodes, the
    KV cache reserved, and the KV the decoding sequences read."""

    def __init__(self, step: IterationModel, traffic: Traffic, limits: EngineLimits, kv_capacity_tokens: int,
                 seed: int):
        self.step, self.limits, self.kv_capacity_tokens = step, limits, kv_capacity_tokens
        self.n = n = traffic.num_requests
        self.isl, self.osl = isl, osl = traffic.prompt_tokens, traffic.output_tokens
        self.window = window = AttentionWindow.of(step.model, limits.sliding_window_kv)
        self.need = window.held_paged(isl + osl, KV_PAGE_TOKENS)
        if self.need > kv_capacity_tokens:
            raise ParaplanError(
                f"one request needs {math.ceil(self.need)} tokens of KV cache but a replica holds {kv_capacity_tokens}; "
                "use more GPUs per replica (tp/pp), an fp8/int8 KV cache or shorter requests")
        self.closed = traffic.concurrency is not None
        if self.closed:
            self.arrivals = np.zeros(n)
            self.released = min(traffic.concurrency, n)
        else:
            self.arrivals = arrival_times_s(traffic, seed)
            self.released = n
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.waiting: deque[int] = deque()
        self.next_arrival = 0             # next request index not yet queued
        self.prefilling: list[list[int]] = []   # [request, prompt tokens done]
        self.decoding_finish: list[tuple[int, int]] = []   # heap of (iteration it finishes at, request)
        self.decode_start_ctx: dict[int, int] = {}
        self.num_decoding = 0
        self.ctx_sum = 0                  # KV tokens the decoding sequences read this iteration
        self.kv_reserved = 0.0
        # sliding-window layers read min(context, w) of a decoding sequence's tokens: their sum,
        # how many sequences are still below the window, and when each reaches it (every
        # sequence starts decoding at isl + 1 and lives osl − 1 iterations, so either all of
        # them reach the window before finishing or none does, in the order they started)
        self.w = window.window or (isl + osl + 1)
        self.win_sum = 0
        self.growing = 0
        self.iterations_to_window = self.w - isl - 1
        self.caps_while_decoding = 0 < self.iterations_to_window < osl - 1
        self.reaching: deque[int] = deque()   # iteration at which a growing sequence reaches w
        self.it = 0
        self.now = 0.0
        self.max_conc = 0
        self.done = 0

    def release_upto(self, t: float) -> None:
        while self.next_arrival < self.released and self.arrivals[self.next_arrival] <= t:
            self.waiting.append(self.next_arrival)
            self.next_arrival += 1

    def admit(self, active: int) -> int:
        """Admission, FCFS, within the batch, the KV cache and the token budget; returns the
        requests active after it."""
        isl, budget_cap = self.isl, self.limits.max_num_tokens
        budget = budget_cap - self.num_decoding
        pending = sum(isl - d for _, d in self.prefilling)
        while (self.waiting and active < self.limits.max_batch
               and self.kv_reserved + self.need <= self.kv_capacity_tokens):
            if self.limits.chunked_prefill:
                if pending >= budget:
                    break
            elif isl <= budget_cap:
                # a whole prompt in one iteration: it waits until the decode tokens leave it room
                if pending + isl > budget:
                    break
            elif self.prefilling:  # longer than any iteration: chunked, one prompt at a time
                break
            self.prefilling.append([self.waiting.popleft(), 0])
            pending += isl
            self.kv_reserved += self.need
            active += 1
        return active

    def decode_run(self, run: int) -> None:
        """Only decoding until the next event (a sequence finishing or reaching the window, an
        arrival while admission is open): the iterations differ only in the KV they read, so
        they are timed at once, each exactly as `iterate` would time it. Admission cannot
        change before the event: the batch, the KV reserved and the token budget stay."""
        D, window = self.num_decoding, self.window
        k = np.arange(run)
        read = ((1.0 - window.share) * (self.ctx_sum + k * D + D)
                + window.share * (self.win_sum + k * self.growing + self.growing))
        dts = self.step.time_s(0, 0.0, D, read, D, prefill_chunks=0, largest_chunk=0)
        starts = np.cumsum(np.concatenate(([self.now], dts)))  # sequential, as now += dt is
        runs = run
        if not self.waiting and self.next_arrival < self.released:  # the loop would admit it at once
            runs = max(1, int(np.searchsorted(starts[:runs], self.arrivals[self.next_arrival], side="left")))
        self.max_conc = max(self.max_conc, D)
        self.now = float(starts[runs])
        self.it += runs
        self.ctx_sum += D * runs
        self.win_sum += self.growing * runs

    def prefill_chunks(self) -> tuple[int, float, int, int, list[int]]:
        """This iteration's prefill chunks: (tokens, attention pairs, chunks, the largest,
        requests whose prompt completes)."""
        P, pairs, chunks, largest = 0, 0.0, 0, 0
        completing = []
        left = max(self.limits.max_num_tokens - self.num_decoding, 0)
        for entry in self.prefilling:
            if left <= 0:
                break
            r, d = entry
            c = min(self.isl - d, left)
            if c <= 0:
                continue
            P += c
            chunks += 1
            largest = max(largest, c)
            pairs += self.window.prefill_pairs(d, c)
            left -= c
            entry[1] = d + c
            if entry[1] >= self.isl:
                completing.append(r)
        return P, pairs, chunks, largest, completing

    def iterate(self) -> None:
        """One iteration of prefill chunks and decode tokens."""
        P, pairs, chunks, largest, completing = self.prefill_chunks()
        D, window = self.num_decoding, self.window
        if P == 0 and D == 0:
            # nothing fits this iteration (cannot happen: with no decode tokens the whole
            # budget is free, and a prompt longer than it is chunked)
            raise AssertionError("serving simulation made no progress")
        self.max_conc = max(self.max_conc, len(self.prefilling) + D)
        read = (1.0 - window.share) * (self.ctx_sum + D) + window.share * (self.win_sum + self.growing)
        dt = self.step.time_s(P, pairs, D, read, D + len(completing), prefill_chunks=chunks, largest_chunk=largest)
        self.now += dt
        self.it += 1
        # decoding sequences each produced a token
        self.ctx_sum += D
        self.win_sum += self.growing
        while self.reaching and self.reaching[0] <= self.it:
            self.reaching.popleft()
            self.growing -= 1
        self.retire_finished()
        if completing:
            self.start_decoding(completing)

    def _retire(self, r: int) -> None:
        """Request r is done: its KV cache freed, the next closed-loop request released."""
        self.finish[r] = self.now
        self.kv_reserved -= self.need
        self.done += 1
        if self.closed and self.released < self.n:
            self.arrivals[self.released] = self.now
            self.released += 1

    def retire_finished(self) -> None:
        isl, osl = self.isl, self.osl
        while self.decoding_finish and self.decoding_finish[0][0] <= self.it:
            _, r = heapq.heappop(self.decoding_finish)
            self.num_decoding -= 1
            self.ctx_sum -= self.decode_start_ctx.pop(r) + (osl - 1)
            self.win_sum -= min(isl + osl, self.w)
            if isl + 1 < self.w and not self.caps_while_decoding:
                self.growing -= 1
            self._retire(r)

    def start_decoding(self, completing: list[int]) -> None:
        """Prompts done this iteration: their first token is out; they decode from the next."""
        isl, osl = self.isl, self.osl
        done_set = set(completing)
        self.prefilling = [e for e in self.prefilling if e[0] not in done_set]
        for r in completing:
            self.first[r] = self.now
            if osl == 1:
                self._retire(r)
                continue
            heapq.heappush(self.decoding_finish, (self.it + osl - 1, r))
            self.decode_start_ctx[r] = isl + 1
            self.ctx_sum += isl + 1
            self.win_sum += min(isl + 1, self.w)
            if isl + 1 < self.w:
                self.growing += 1
                if self.caps_while_decoding:
                    self.reaching.append(self.it + self.iterations_to_window)
            self.num_decoding += 1

    def result(self) -> ServingResult:
        n, isl, osl = self.n, self.isl, self.osl
        start = float(self.arrivals.min())
        ttft = self.first - self.arrivals
        tpot = (self.finish - self.first) / (osl - 1) if has_tpot(osl) else np.zeros(0)
        return ServingResult(ttft_s=ttft, tpot_s=tpot, e2e_s=self.finish - self.arrivals,
                             makespan_s=float(np.nanmax(self.finish)) - start, num_iterations=self.it,
                             output_tokens=n * osl, prompt_tokens=n * isl, max_concurrency=self.max_conc,
                             kv_capacity_tokens=self.kv_capacity_tokens)


def simulate(step: IterationModel, traffic: Traffic, limits: EngineLimits, kv_capacity_tokens: int,
             seed: int = 0, *, decode_runs: bool = True) -> ServingResult:
    """Serve `traffic` on one replica; returns per-request latencies and throughput.
    `decode_runs`: time a run of decode-only iterations at once (the same result, one
    iteration at a time with False: tests/test_serving_speed.py compares the two)."""
    R = _Replica(step, traffic, limits, kv_capacity_tokens, seed)
    while R.done < R.n:
        R.release_upto(R.now)
        active = len(R.prefilling) + R.num_decoding
        if active == 0 and not R.waiting:
            if R.next_arrival >= R.released:  # closed loop waiting on nothing: cannot happen
                break
            R.now = max(R.now, float(R.arrivals[R.next_arrival]))
            continue
        R.admit(active)
        run = (_decode_run(R.decoding_finish, R.reaching, R.it)
               if decode_runs and not R.prefilling and R.num_decoding else 0)
        if run > 1:
            R.decode_run(run)
        else:
            R.iterate()
    return R.result()
