"""Pipeline schedule simulation: schedules as data (schedules.py) and the simulator
that times them (engine.py)."""
