"""The integrity rules the supervisor applies to each timed block: pure functions over what its
clocks, the workers' cgroups and NVML recorded, testable without a container or a device."""

from __future__ import annotations

# A block's bracket may exceed the worker's accounted time (window + staging) by the socket round
# trip and the process wake-up, measured per worker at start, plus this fixed and relative slack.
BRACKET_SLACK_NS = 300_000
BRACKET_SLACK_REL = 0.03
CLOCK_EPSILON_NS = 20_000
SYSTEMATIC_FRACTION = 0.25
# Throttle reasons that mean the chip slowed for something other than the stage's own load.
BAD_THROTTLE = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# A subject's input staging may not exceed the other subject's for the same inputs by more than this
# (staging sits outside the window: work hidden there would be free).
STAGE_SLACK_NS = 1_000_000
STAGE_SLACK_REL = 1.0
# Likewise the CPU a worker spends in the untimed command after its window (fetch or release).
POST_SLACK_NS = 3_000_000
POST_SLACK_REL = 1.0
# Frozen, yet its work still holds the device: confirmed by this many probes in a row (one slow probe
# is a host hiccup; queued kernels keep every probe slow), this many times in one series (after its
# warm-up, a window, a release), ends the stage. Each such block is void anyway; stopping bounds what a
# flood of queued work costs the stage (each of the worker's own synchronises waits the whole flood).
LEFT_RUNNING_PROBES = 3
LEFT_RUNNING_BLOCKS = 3
# ...or once, where it keeps the device busy this long without a break, every probe slow, with every
# worker frozen: each of a worker's commands ends in a whole-device synchronise and a frozen process
# launches nothing, so seconds of it are queued work that outlives its command, not a hiccup. On the
# H100 (2026-12-06) a flood started in the warm-up otherwise took three commands of ~25 s of backlog
# each, 193 s of the stage, before the count above stopped it.
LEFT_RUNNING_PERSIST_S = 2.0
# The idle probe (a one-element add plus synchronise) on an idle H200/H100: p50 0.012-0.021 ms, p98 at
# most 0.044 ms; beside another context's running kernel 0.78 ms (tests/gpu/README.md, 2026-12-03).
# A calibration whose median is above this ceiling was taken beside running work, and the limit it
# would set (4 x p98) hides exactly what the probe is there to see; it is retried, then refused.
IDLE_PROBE_CEILING_NS = 250_000
CALIBRATION_TRIES = 5
CALIBRATION_PAUSE_S = 0.4


def check_bracket(
    t_ns: int, stage_ns: int, bracket_ns: int, rtt_ns: int, worker_cpu_ns: int | None = None
) -> tuple[str, str]:
    """(kind, why) when the supervisor's clock does not confirm a worker's claimed time, ("", "") when it does.

    "impossible": the worker claims more time than passed around the whole command — a forged
    figure, whatever the load. "unexplained": the clock saw more than the worker accounts for, and
    the worker's cgroup was on a CPU for that extra time — work hidden outside the window, or a clock
    it slowed; such a block is voided, and a worker whose blocks are often so is a violation
    (`systematic_disagreement`). "descheduled": the extra time was not spent on a CPU by the worker
    (it, or the supervisor, waited for a core on a loaded host): recorded, the sample stands. Pure."""
    if t_ns <= 0:
        return "impossible", f"worker claimed a non-positive time ({t_ns} ns)"
    if t_ns + stage_ns > bracket_ns + CLOCK_EPSILON_NS:
        return "impossible", (
            f"worker claimed {t_ns + stage_ns} ns (window {t_ns} + staging {stage_ns}) but the "
            f"supervisor's clock saw only {bracket_ns} ns around the whole command"
        )
    unexplained = bracket_ns - t_ns - stage_ns
    allowed = 2 * rtt_ns + BRACKET_SLACK_NS + int(BRACKET_SLACK_REL * bracket_ns)
    if unexplained <= allowed:
        return "", ""
    why = (
        f"the supervisor's clock saw {bracket_ns} ns around the command, {unexplained} ns more than the "
        f"worker's window ({t_ns}) and staging ({stage_ns}) account for (allowed {allowed})"
    )
    if worker_cpu_ns is not None and worker_cpu_ns <= t_ns + stage_ns + allowed:
        return (
            "descheduled",
            why + f"; the worker's CPU time in it was {worker_cpu_ns} ns: it was waiting, not working",
        )
    return "unexplained", why


def systematic_disagreement(flags: list[bool]) -> bool:
    """Too many of one worker's blocks unexplained by its claims to be scheduling noise."""
    return len(flags) > 0 and sum(flags) > max(1, SYSTEMATIC_FRACTION * len(flags))


def check_staging(stage_a: int, stage_b: int) -> str:
    """Why subject A's staging is suspicious next to B's staging of the same inputs ("" when not)."""
    limit = int(stage_b * (1 + STAGE_SLACK_REL)) + STAGE_SLACK_NS
    if stage_a > limit:
        return f"input staging took {stage_a} ns against {stage_b} ns for the other subject (limit {limit})"
    return ""


def check_post_cpu(post_ns: int, other_ns: int) -> str:
    """Why the CPU a worker used after its window (fetching or releasing the output) is suspicious
    next to the other subject's for the same command ("" when not): deferred work would run there."""
    limit = int(other_ns * (1 + POST_SLACK_REL)) + POST_SLACK_NS
    if post_ns > limit:
        return f"{post_ns} ns of CPU after the window (the other subject: {other_ns}; limit {limit})"
    return ""


def left_running(confirmed_blocks: int, foreign_contexts: int | None, busy_s: float = 0.0) -> bool:
    """Is a subject's work left running past its windows, beyond doubt? Only where NVML counted no
    other process's context on the device (another tenant's kernels would also keep it busy): after
    LEFT_RUNNING_BLOCKS confirmed commands, or at once where the device stayed busy, probe after
    probe, for LEFT_RUNNING_PERSIST_S (`busy_s`) with the subject frozen."""
    return foreign_contexts == 0 and (
        confirmed_blocks >= LEFT_RUNNING_BLOCKS or busy_s >= LEFT_RUNNING_PERSIST_S
    )


def calibration_busy(p50_ns: int) -> bool:
    """Was the idle probe calibrated beside running work (its median above an idle device's, by far)?"""
    return p50_ns > IDLE_PROBE_CEILING_NS


def busy_at_start_code(foreign_contexts: int | None) -> str:
    """The failure code when the device stays busy with every worker frozen before the first block:
    no other process held a context, so a subject's work started at load outlives it (integrity);
    otherwise another tenant, or NVML could not tell: the device is busy, nothing is measured."""
    return "integrity_violation" if foreign_contexts == 0 else "device_busy"
