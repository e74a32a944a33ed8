"""Threads that fit the machine as it is (llmchat.engine.threads).

The tuner's decisions are checked on a simulated machine: a step's time is a function of the
thread count and of what else the machine runs, and the clock and /proc/stat readings are the
simulation's. Nothing here measures this machine's speed. The engine tests check that the count
the tuner holds is the one llama.cpp's context runs, and what the record and --verbose say.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmchat.engine.threads import (
    CpuReading,
    ThreadTuner,
    cgroup_quota,
    thread_tuner,
    threads_at_load,
    usable_cores,
)


class SimulatedMachine:
    """Two cores. Quiet: a step takes 10 ms on 2 threads, 18 ms on 1. With one core busy: 25 ms on
    2 threads (the thread that shares its core holds up every step), 14 ms on 1."""

    QUIET = {2: 0.010, 1: 0.018}
    ONE_CORE_BUSY = {2: 0.025, 1: 0.014}

    def __init__(self, threads: int):
        self.threads = threads
        self.busy = False
        self.clock = 0.0
        self.others_s = 0.0  # CPU seconds other processes have used
        self.applied: list[int] = []

    def apply(self, threads: int) -> None:
        self.threads = threads
        self.applied.append(threads)

    def read_cpu(self) -> CpuReading:
        return CpuReading(self.clock, self.others_s, 0.0, True)

    def now(self) -> float:
        return self.clock

    def tuner(self, most: int = 2) -> ThreadTuner:
        return ThreadTuner(self.threads, "test", most, self.apply, fixed=False, read_cpu=self.read_cpu, clock=self.now)

    def decode(self, tuner: ThreadTuner, steps: int) -> list[int]:
        """Run `steps` decode steps; the thread count at each."""
        counts = []
        for _ in range(steps):
            seconds = (self.ONE_CORE_BUSY if self.busy else self.QUIET)[self.threads]
            self.clock += seconds
            self.others_s += seconds if self.busy else 0.0
            counts.append(self.threads)
            tuner.observe(1, seconds)
        return counts


def test_a_quiet_machine_keeps_every_core_and_tries_nothing():
    machine = SimulatedMachine(threads=2)
    tuner = machine.tuner()
    counts = machine.decode(tuner, 2000)
    assert set(counts) == {2}
    assert machine.applied == [] and tuner.changes == 0 and tuner.why == "test"


def test_load_that_arrives_mid_reply_moves_to_one_thread_and_back_when_it_leaves():
    machine = SimulatedMachine(threads=2)
    tuner = machine.tuner()
    machine.decode(tuner, 100)
    machine.busy = True
    counts = machine.decode(tuner, 300)
    switched = counts.index(1)
    assert switched <= 10  # a handful of slow steps, then one thread
    after = counts[switched:]
    assert after.count(2) <= 4 * 3  # kept (14 ms against 25): 2 threads only tried at 32, 64, 128 steps on
    assert "with 1 threads against" in tuner.why
    machine.busy = False
    counts = machine.decode(tuner, 200)
    assert counts[-1] == 2 and tuner.threads == 2  # one more was tried, and was faster again
    assert counts.index(2) <= 40


def test_a_machine_busy_from_the_start_stays_on_one_thread_and_retries_ever_more_rarely():
    machine = SimulatedMachine(threads=1)  # what threads_at_load chose
    machine.busy = True
    tuner = machine.tuner()
    counts = machine.decode(tuner, 3000)
    tries = machine.applied.count(2)
    assert tuner.threads == 1 and counts[-1] == 1
    assert 1 <= tries <= 7  # 32, 64, 128, ... steps apart: a few, not one per 32 steps
    assert counts.count(2) <= tries * 4


def test_other_processes_getting_busy_during_a_prefill_try_one_thread_fewer():
    machine = SimulatedMachine(threads=2)
    tuner = machine.tuner()
    machine.busy = True
    machine.clock += 1.0
    machine.others_s += 1.0  # another process took a whole core for the last second
    tuner.observe(512, 2.0)  # a prefill chunk
    assert machine.applied == [1]
    machine.decode(tuner, 10)
    assert tuner.threads == 1 and tuner.why == "1 of 2 cores: other processes got busy"


def test_a_fixed_count_is_never_changed():
    machine = SimulatedMachine(threads=2)
    tuner = ThreadTuner(2, "--threads", 2, machine.apply, fixed=True, read_cpu=machine.read_cpu, clock=machine.now)
    machine.busy = True
    machine.decode(tuner, 500)
    assert machine.applied == [] and tuner.threads == 2


def test_thread_tuner_keeps_a_fixed_count_and_sets_every_context():
    class Context:
        def __init__(self) -> None:
            self.threads: list[int] = []

        def set_threads(self, threads: int) -> None:
            self.threads.append(threads)

    model, draft = Context(), Context()
    tuner = thread_tuner(3, 8, False, [model, draft], CpuReading.now())
    assert (tuner.threads, tuner.why) == (3, "--threads") and model.threads == draft.threads == []
    tuner = thread_tuner(None, 4, True, [model], CpuReading.now())
    assert tuner.threads == 4 and "GPU" in tuner.why


def test_cpu_readings_count_other_processes_only():
    earlier = CpuReading(10.0, 100.0, 5.0, True)
    later = CpuReading(11.0, 101.8, 5.9, True)  # 1.8 busy CPU-seconds in 1 s, 0.9 of them ours
    assert later.others_since(earlier) == pytest.approx(0.9)
    assert CpuReading(10.05, 101.0, 5.0, True).others_since(earlier) is None  # too short to tell
    assert CpuReading(11.0, 0.0, 5.0, False).others_since(earlier) is None
    now = CpuReading.now()
    assert now.readable == Path("/proc/stat").exists()


def test_a_cgroup_quota_caps_the_cores(tmp_path):
    assert cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5
    physical = len(os.sched_getaffinity(0))
    cores, why = usable_cores(physical + 4, 1.5)
    assert cores == min(2, physical) and ("quota of 1.5" in why or "affinity" in why)
    assert usable_cores(1, None) == (1, "1 physical cores")
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_quota(v1) == 3.0


def test_the_affinity_mask_caps_the_cores():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity masks on this platform")
    saved = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(saved)})
        cores, why = usable_cores(64, None)
    finally:
        os.sched_setaffinity(0, saved)
    assert cores == 1 and "affinity" in why


def test_the_engine_runs_the_count_its_tuner_holds(smollm2_path):
    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.core import Engine
    from llmchat.engine.model_load import EngineSettings

    engine = Engine.load(smollm2_path, EngineSettings(n_ctx=512, threads=1))
    try:
        assert engine.threads == 1 and engine.info.threads == 1 and engine.info.threads_why == "--threads"
        assert int(llama_cpp.llama_n_threads(engine.model.ctx)) == 1
        engine.model.set_threads(2)  # what the tuner's `apply` does
        assert int(llama_cpp.llama_n_threads(engine.model.ctx)) == 2
        assert int(llama_cpp.llama_n_threads_batch(engine.model.ctx)) == 2
    finally:
        engine.close()


def test_a_load_reads_other_processes_from_where_it_begins(smollm2_path, monkeypatch):
    """Without a load begun ahead, `Engine.load` takes its own reading first: the window it
    compares the end of the load with covers the load, and not time before it."""
    import time

    from llmchat.engine import core
    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.model_load import EngineSettings

    load_began: list[float] = []
    readings: list[CpuReading] = []
    real_load, real_tuner = llama_cpp.llama_model_load_from_file, core.thread_tuner

    def recorded_load(*args):
        load_began.append(time.monotonic())
        return real_load(*args)

    def recorded_tuner(fixed, most, all_on_gpu, contexts, since):
        readings.append(since)
        return real_tuner(fixed, most, all_on_gpu, contexts, since)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", recorded_load)
    monkeypatch.setattr(core, "thread_tuner", recorded_tuner)
    started = time.monotonic()
    engine = core.Engine.load(smollm2_path, EngineSettings(n_ctx=256, flash_attn=False))
    engine.close()
    assert len(load_began) == 1 and len(readings) == 1
    assert started <= readings[0].wall <= load_began[0]


def test_the_record_and_verbose_say_how_many_threads_and_why(smollm2_path, cli):
    fixed = cli("ask", "-m", str(smollm2_path), "--json", "-n", "4", "--threads", "1", "--verbose", "Hi")
    assert fixed.returncode == 0, fixed.stderr
    stats = json.loads(fixed.stdout)["stats"]
    assert (stats["threads"], stats["threads_why"]) == (1, "--threads")
    assert "threads: 1 (--threads)" in fixed.stderr
    chosen = cli("ask", "-m", str(smollm2_path), "--json", "-n", "4", "Hi")
    assert chosen.returncode == 0, chosen.stderr
    stats = json.loads(chosen.stdout)["stats"]
    assert 1 <= stats["threads"] <= (os.cpu_count() or 1)
    assert stats["threads_why"]  # the cores, a quota, a busy machine or a measured count


def test_a_tried_count_that_is_plainly_slower_loses_on_its_first_step():
    machine = SimulatedMachine(threads=1)
    machine.busy = True
    machine.ONE_CORE_BUSY = {2: 2.0, 1: 0.014}  # spinning threads on a busy core: 140 times as long
    tuner = machine.tuner()
    counts = machine.decode(tuner, 1000)
    tries = machine.applied.count(2)
    assert tries >= 1 and tuner.threads == 1
    assert counts.count(2) == tries  # one step each, not a warm-up and three measured


def test_cores_other_processes_kept_busy_over_the_load_are_left_to_them():
    if len(os.sched_getaffinity(0)) < 2 or not CpuReading.now().readable:
        pytest.skip("needs two usable CPUs and /proc/stat")
    now = CpuReading.now()
    # A second ago, the machine had done 1.0 CPU-second less work, none of it this process's.
    busy_since = CpuReading(now.wall - 1.0, now.busy_s - 1.0, now.own_s, True)
    threads, why = threads_at_load(2, busy_since)
    assert threads == 1 and "busy with other processes at load" in why
    quiet_since = CpuReading(now.wall - 1.0, now.busy_s, now.own_s, True)
    assert threads_at_load(2, quiet_since) == (2, "2 physical cores")
