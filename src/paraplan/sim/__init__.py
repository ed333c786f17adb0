"""Pipeline schedule simulation: schedules as data (schedules.py) and the event loop
that times them (engine.py)."""
