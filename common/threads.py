"""How torch's CPU threads wait and how many there are, on cores other processes may share.

torch runs its kernels on an OpenMP team of one thread per core, and by default (libgomp's
OMP_WAIT_POLICY unset) a thread that has finished its share spins on its core, up to about
300,000 polls, before it sleeps. On an idle machine that saves a wake-up per kernel; when
other processes hold the cores, the spinning thread burns the time slice its team-mate needs
to finish, and every kernel waits on the scheduler. Two steps, because OpenMP reads its wait
policy once, when torch loads it:

    wait_passively()    before torch is imported (common/pytorch/__init__.py): OMP_WAIT_POLICY=PASSIVE,
                        unless the user set a wait policy of their own
    start_up()          at the start of a run (common/pytorch/run.py): one INFO line saying how
                        many threads torch runs and how they wait, and why (choose_threads())

torch's thread count stays one a core whatever the load: with the passive wait fewer threads
were slower under load (benchmarks/threads_under_load.py; the figures are in
benchmarks/README.md), and a count that followed the load would make a run's last digits
follow it too. Threads that still spin (torch imported before common.pytorch, or the user's
policy) keep it as well, and the log line says how to have them sleep. A user's
OMP_NUM_THREADS (or MKL_NUM_THREADS), a torch.set_num_threads made before the run, and a
user's OMP_WAIT_POLICY / GOMP_SPINCOUNT / KMP_BLOCKTIME always win. torch's inter-op pool is
left alone: eager training never starts it.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Mapping, MutableMapping

logger = logging.getLogger("zoo")

# The settings of the way an OpenMP thread waits: the standard one, libgomp's (torch's wheels)
# and Intel's libiomp (builds against MKL's OpenMP).
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
# The settings of the thread count that torch reads when it starts (OpenMP's, then MKL's).
COUNT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_wait: "Wait | None" = None  # what wait_passively() found and did, for start_up()
_started = False


@dataclass(frozen=True)
class Wait:
    setting: dict  # the variables to set before torch loads
    passive: bool  # whether torch's threads will sleep, not spin, while they wait
    note: str  # for the log line


def wait_setting(environ: Mapping[str, str], torch_loaded: bool) -> Wait:
    """What to set before torch loads OpenMP, and whether its threads will then wait passively."""
    given = [f"{name}={environ[name]}" for name in WAIT_VARIABLES if name in environ]
    if given:  # the user's, read by OpenMP when torch loaded or loads
        return Wait({}, environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE",
                    f"{', '.join(given)} from the environment")
    if torch_loaded:
        return Wait({}, False, "OpenMP's default wait, spinning (torch was imported before common.pytorch, "
                               "which would have set OMP_WAIT_POLICY=PASSIVE)")
    return Wait({"OMP_WAIT_POLICY": "PASSIVE"}, True, "OMP_WAIT_POLICY=PASSIVE (a waiting thread sleeps)")


def wait_passively(environ: MutableMapping[str, str] = os.environ) -> None:
    """Make torch's OpenMP threads sleep while they wait; a no-op where the user set a policy.

    Takes effect only before torch is first imported: OpenMP reads the variable when it loads."""
    global _wait
    if _wait is not None:
        return
    _wait = wait_setting(environ, "torch" in sys.modules)
    environ.update(_wait.setting)


@dataclass(frozen=True)
class Choice:
    threads: int | None  # the count the zoo keeps; None: the user's
    reason: str


def count_from_environment(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The first of COUNT_VARIABLES that is set, as (name, value); a value OpenMP cannot read is a UserError."""
    from common.errors import UserError

    for name in COUNT_VARIABLES:
        if name in environ:
            value = environ[name]
            first = value.split(",")[0].strip()  # OpenMP takes a list, one count per nesting level
            if not first.isdigit() or int(first) < 1:
                raise UserError(f"the environment's {name}={value!r} is not a positive whole number of threads; "
                                f"set it to one (e.g. {name}=1) or unset it")
            return name, value
    return None


def choose_threads(cpus: int, load1: float, passive: bool, environ: Mapping[str, str], current: int,
                   default: int) -> Choice:
    """torch's intra-op thread count for a run starting now, and why.

    ``cpus``: the cores this process may run on (os.sched_getaffinity); ``load1``: the 1-minute
    load average; ``passive``: torch's threads sleep while they wait (Wait.passive);
    ``current``: torch.get_num_threads(); ``default``: the count torch starts with when
    nothing sets it.

    The user's setting wins; otherwise torch's count, one thread a core, at any load. Fewer
    threads under load were slower with the passive wait; with the spinning wait one thread
    was faster, but then the figures of a run would depend on the load at its start, so the
    reason names the remedy instead (the passive wait)."""
    given = count_from_environment(environ)
    if given is not None:
        return Choice(None, f"{given[0]}={given[1]} from the environment")
    if current != default:
        return Choice(None, f"torch.set_num_threads({current}) before the run (torch's default: {default})")
    waiting = ("waiting threads sleep, so the load takes no thread away" if passive else
               "waiting threads spin, which under load is many times slower: set OMP_WAIT_POLICY=PASSIVE, "
               "or import common.pytorch before torch")
    return Choice(default, f"one a core: {cpus} cores, load average {load1:.2f} (1 minute); {waiting}")


def physical_cores(cpus: set[int]) -> int:
    """The physical cores among ``cpus`` (the count torch's default follows: MKL's, one thread a core)."""
    cores = set()
    for cpu in cpus:
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topology + "physical_package_id") as package, open(topology + "core_id") as core:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:  # no sysfs (another OS, a sandbox): every CPU a core
            cores.add(("cpu", str(cpu)))
    return max(len(cores), 1)


def start_up() -> None:
    """Log torch's thread count and OpenMP's wait for this run, and why (once a process); a thread
    count in the environment that OpenMP cannot read is a UserError."""
    global _started
    if _started:
        return
    import torch

    cpus = os.sched_getaffinity(0)
    wait = _wait or wait_setting(os.environ, torch_loaded=True)  # torch is loaded now
    choice = choose_threads(len(cpus), os.getloadavg()[0], wait.passive, os.environ, torch.get_num_threads(),
                            min(physical_cores(cpus), len(cpus)))
    _started = True
    logger.info(f"torch threads: {torch.get_num_threads()} ({choice.reason}); OpenMP wait: {wait.note}")
