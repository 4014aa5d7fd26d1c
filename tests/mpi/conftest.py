"""One report per MPI world. Under ``mpirun -n N pytest --with-mpi`` every rank runs the tests, but
only rank 0 prints: the other ranks' terminal output is switched off, and at the end of the run
each of them sends rank 0 its failed and errored reports (test id, message, traceback) and its
counts over MPI point-to-point messages. Rank 0 adds those failures to its own summary, marked
``[rank r]``, prints one line with the other ranks' counts, and exits non-zero if any rank failed.
A rank that sends nothing within RAWFLUX_TEST_GATHER_S seconds (default 300) of rank 0's end is
reported as missing (and fails the run); a rank whose report rank 0 did not acknowledge keeps its
own exit status."""
from __future__ import annotations

import os
import time

import pytest

_TAG = 0x7AF1  # MPI tag of the end-of-run report, apart from any tag the tests use
_state: dict = {}


def _world():
    """(comm, rank, size) under --with-mpi with several ranks, else None."""
    return _state.get("world")


class _QuietReporter:
    """Stands in for the terminal reporter on ranks > 0: no progress, no summary, but a terminal
    writer for what writes to it directly (pytest-timeout's stack dump)."""

    def __init__(self, tw):
        self._tw = tw
        self.stats: dict = {}


@pytest.hookimpl(trylast=True)  # after the terminal reporter and pytest-mpi have configured
def pytest_configure(config):
    if not config.getoption("--with-mpi", default=False):
        return
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size < 2:
        return
    _state.update(world=(comm, comm.rank, comm.size), config=config, reports=[], counts={})
    for plugin in config.pluginmanager.get_plugins():  # pytest-mpi's 25-line MPI section: one line instead
        if type(plugin).__name__ == "MPIPlugin" and hasattr(plugin, "_is_testing_mpi"):
            plugin._is_testing_mpi = False
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if comm.rank > 0 and reporter is not None:
        config.pluginmanager.unregister(reporter)
        config.pluginmanager.register(_QuietReporter(reporter._tw), "terminalreporter")


def _record(config, report) -> None:
    if _world()[1] == 0:  # rank 0 reports for itself
        return
    category = config.hook.pytest_report_teststatus(report=report, config=config)[0]
    if category:
        _state["counts"][category] = _state["counts"].get(category, 0) + 1
    if report.failed:
        _state["reports"].append(config.hook.pytest_report_to_serializable(config=config, report=report))


def pytest_runtest_logreport(report):
    if _world() is not None:
        _record(_state["config"], report)


def pytest_collectreport(report):
    if _world() is not None and report.failed:
        _record(_state["config"], report)


def _wait(test, deadline: float) -> bool:
    while not test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def pytest_sessionfinish(session, exitstatus):
    world = _world()
    if world is None:
        return
    from mpi4py import MPI

    comm, rank, size = world
    deadline = time.monotonic() + float(os.environ.get("RAWFLUX_TEST_GATHER_S") or 300)
    if rank > 0:
        req = comm.isend({"counts": _state["counts"], "reports": _state["reports"]}, dest=0, tag=_TAG)
        if _wait(req.Test, deadline) and _wait(lambda: comm.iprobe(source=0, tag=_TAG + 1), deadline):
            comm.recv(source=0, tag=_TAG + 1)
            # Rank 0 has this rank's failures and exits non-zero for them. Exiting 0 here keeps mpirun
            # from killing rank 0 before it has printed them (it ends the job at the first non-zero exit).
            session.exitstatus = pytest.ExitCode.OK
        return
    received, missing = {}, []
    for r in range(1, size):
        if _wait(lambda: comm.iprobe(source=r, tag=_TAG), deadline):
            received[r] = comm.recv(source=r, tag=_TAG)
            comm.send(True, dest=r, tag=_TAG + 1)
        else:
            missing.append(r)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    failed = bool(missing)
    for r, msg in received.items():
        for data in msg["reports"]:
            rep = session.config.hook.pytest_report_from_serializable(config=session.config, data=data)
            rep.nodeid = f"{rep.nodeid} [rank {r}]"
            if isinstance(getattr(rep, "location", None), tuple) and not isinstance(rep, pytest.CollectReport):
                path, line, domain = rep.location
                rep.location = (path, line, f"{domain} [rank {r}]")  # the FAILURES section's headline
            category = session.config.hook.pytest_report_teststatus(report=rep, config=session.config)[0] or "error"
            if reporter is not None:
                reporter.stats.setdefault(category, []).append(rep)
            failed = True
    library = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
    _state["summary"] = (received, missing, library, size)
    if failed and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _counts_text(counts: dict) -> str:
    order = ("failed", "passed", "skipped", "xfailed", "xpassed", "error")
    keys = [k for k in order if counts.get(k)] + sorted(k for k in counts if k not in order and counts[k])
    return ", ".join(f"{counts[k]} {k}" for k in keys) or "no tests"


def _ranks_text(ranks: list[int]) -> str:
    spans, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            spans.append(str(a) if a == start else f"{start}-{a}")
            start = b
    return ("ranks " if len(ranks) > 1 else "rank ") + ",".join(spans)


def pytest_terminal_summary(terminalreporter):
    if "summary" not in _state:
        return
    received, missing, library, size = _state["summary"]
    groups: dict[str, list[int]] = {}
    for r, msg in sorted(received.items()):
        groups.setdefault(_counts_text(msg["counts"]), []).append(r)
    parts = [f"{_ranks_text(rs)}: {text}" for text, rs in groups.items()]
    if missing:
        parts.append(f"{_ranks_text(missing)}: no report")
    terminalreporter.write_line(f"MPI world of {size} ({library}): " + "; ".join(parts)
                                + "; below: rank 0, with every rank's failures", red=bool(missing))
