"""Simulated pipeline bubbles reproduce the published closed forms.

Bubble fraction = (step - ideal) / ideal, ideal = the busiest rank's work (Narayanan et
al. SC'21 Sec. 2.2). Uniform costs with binary-exact values (1 s, 2 s, ...) make the
simulated fractions exactly equal to the closed forms, so most checks use `==`.
"""

from __future__ import annotations

import pytest

from paraplan.plan.axes import Schedule
from paraplan.sim.engine import StageCosts, simulate
from paraplan.sim.schedules import build_schedule

F_S, B_S = 1.0, 2.0  # one micro-batch's forward / backward through a whole rank


def bubble(schedule, p, m, v=1, forward_s=F_S, backward_s=B_S, weight_s=0.0, p2p_s=0.0):
    costs = StageCosts.uniform(p, v, forward_s, backward_s, weight_s, p2p_s)
    return simulate(build_schedule(schedule, p, m, v), costs)


@pytest.mark.parametrize("schedule", [Schedule.ONE_F_ONE_B, Schedule.GPIPE])
@pytest.mark.parametrize("p, m", [(1, 4), (2, 4), (4, 8), (4, 4), (4, 2), (8, 32), (3, 7), (16, 64)])
def test_1f1b_and_gpipe_bubble_is_p_minus_1_over_m(schedule, p, m):
    # Narayanan et al. SC'21 Sec. 2.2.1: bubble fraction (p-1)/m for GPipe and 1F1B.
    assert bubble(schedule, p, m).bubble_fraction == (p - 1) / m


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 4, 2), (4, 12, 3), (8, 16, 4), (8, 8, 2)])
def test_interleaved_bubble_is_p_minus_1_over_vm(p, m, v):
    # Narayanan et al. SC'21 Sec. 2.2.2: with v chunks of cost F/v and B/v per rank the
    # bubble shrinks v-fold to (p-1)/(v m). Chunk costs 1 s and 2 s keep it exact.
    result = bubble(Schedule.INTERLEAVED_1F1B, p, m, v, F_S, B_S)
    assert result.bubble_fraction == (p - 1) / (v * m)
    assert result.bubble_s[0] == (p - 1) * (F_S + B_S)  # (p-1)(t_f + t_b) with chunk times


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 4, 2), (4, 6, 2), (4, 8, 3), (8, 12, 3), (8, 9, 4)])
def test_breadth_first_matches_interleaved_when_m_at_least_p(p, m, v):
    # Lamy-Poirier MLSys'23 Sec. 3-4: looping breadth-first has the same bubble as the
    # depth-first (interleaved) schedule, (p-1)/(v m), and needs no m % p == 0; here it
    # holds whenever the first micro-batch is back at rank 0 before rank 0 has run every
    # micro-batch through the chunk, i.e. m >= p.
    assert bubble(Schedule.BREADTH_FIRST, p, m, v).bubble_fraction == (p - 1) / (v * m)


@pytest.mark.parametrize("p, m, v", [(4, 2, 2), (8, 3, 2), (8, 5, 3)])
def test_breadth_first_with_fewer_microbatches_than_stages_waits_each_loop(p, m, v):
    # Derived (not in the paper): with m < p every forward and backward loop waits for the
    # first micro-batch to come round, so step = (v p + m - 1)(t_f + t_b) and the bubble
    # is (v (p - m) + m - 1) / (v m), above (p-1)/(v m).
    result = bubble(Schedule.BREADTH_FIRST, p, m, v)
    assert result.step_time_s == (v * p + m - 1) * (F_S + B_S)
    assert result.bubble_fraction == (v * (p - m) + m - 1) / (v * m)
    assert result.bubble_fraction > (p - 1) / (v * m)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 8), (8, 24), (3, 7)])
def test_zero_bubble_h1_bubble_is_a_third_of_1f1b(p, m):
    # Qi et al. 2024 Sec. 3.1: with T_F = T_B = T_W, 1F1B's bubble (p-1)(T_F + T_B + T_W)
    # drops to (p-1)(T_F + T_B - T_W) under ZB-H1: a third.
    t = 1.0
    zb = bubble(Schedule.ZERO_BUBBLE, p, m, 1, t, t, t)
    one_f_one_b = bubble(Schedule.ONE_F_ONE_B, p, m, 1, t, 2 * t)
    assert zb.bubble_s == ((p - 1) * t,) * p
    assert one_f_one_b.bubble_s == (3 * (p - 1) * t,) * p
    if p > 1:
        assert zb.bubble_fraction < one_f_one_b.bubble_fraction
        assert zb.step_time_s < one_f_one_b.step_time_s


@pytest.mark.parametrize("f, b, w", [(1.0, 1.0, 0.5), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 2.0, 0.0)])
@pytest.mark.parametrize("p, m", [(4, 8), (5, 5), (6, 13)])
def test_zero_bubble_h1_bubble_closed_form(f, b, w, p, m):
    # Qi et al. 2024 Sec. 3.1: ZB-H1 bubble (p-1)(T_F + T_B - T_W). In this simulator it
    # holds exactly when m >= p and T_W <= min(T_F, T_B); a larger T_W leaves more bubble.
    zb = bubble(Schedule.ZERO_BUBBLE, p, m, 1, f, b, w)
    assert zb.bubble_s == ((p - 1) * (f + b - w),) * p


@pytest.mark.parametrize("f, b, w", [(1.0, 1.0, 0.5), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 1.0)])
@pytest.mark.parametrize("p, m", [(4, 1), (4, 3), (6, 2), (5, 4), (2, 1)])
def test_zero_bubble_h1_with_fewer_microbatches_than_stages(f, b, w, p, m):
    # Derived from this simulator (not in the paper): with m < p the bubble grows by one W
    # pass per missing micro-batch, (p-1)(T_F + T_B - T_W) + (p-m)·T_W, as cost/evaluate.py's
    # closed form has it; exact for T_W <= min(T_F, T_B)
    zb = bubble(Schedule.ZERO_BUBBLE, p, m, 1, f, b, w)
    assert zb.bubble_s == ((p - 1) * (f + b - w) + (p - m) * w,) * p
