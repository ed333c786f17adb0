"""Search the plan space and rank plans."""
