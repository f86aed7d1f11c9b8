"""Tests of the planner's flow (what is measured, cached, chosen) must not depend on what else the test machine is
running: they patch the CPU watch (assembly/contention.py, as assembly/measured.py watches every measurement) to
report a quiet machine. The contention test
(tests/test_plan.py, CPU-burning children) watches for real."""
from specedge.assembly import contention, measured, plan_measure


class QuietWatch(contention.CpuWatch):
    def stop(self) -> contention.Load:
        self.load = contention.Load(0.0, 0.0, 0.0)
        return self.load


def assume_quiet(monkeypatch) -> None:
    monkeypatch.setattr(measured, "CpuWatch", QuietWatch)
    monkeypatch.setattr(plan_measure, "MIN_DRIFT_S", float("inf"))
