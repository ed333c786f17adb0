"""Cost model: FLOPs, memory, communication and time per operator.

Every function here accepts a plan whose numeric fields are Python ints *or* numpy arrays
(a PlanBatch from plan/space.py), so that one formula serves both `estimate` (one plan)
and `search` (millions of plans at once).
"""
