"""Log lines that announce a measurement.

Whatever measures on a user's behalf (a plan, a device profile, an engine's per-file gate) first says why, about how
long, and how to skip it, in one line passed as `Measuring(text)`: a str, so every front end prints it as it prints
any line, and a type, so `Engine.open`'s logger (apps/api.py) says it at WARNING where its other lines are INFO: a
measurement is never silent, even with logging left unconfigured.
"""
from __future__ import annotations


class Measuring(str):
    """A log line announcing a measurement: its reason, its estimate, how to skip it."""
