"""`pytest --cpu-durations=N`: the N tests that used the most CPU (this process and the
processes it started and waited for, setup to teardown). Wall-clock durations on a loaded
machine say who waited; CPU seconds say who costs: the figure to cut when CI is too slow."""

from __future__ import annotations

import resource

import pytest

CPU_KEY = "cpu_s"
_start = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=0,
        metavar="N",
        help="List the N most CPU-costly tests.",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_start] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    if call.when == "teardown" and _start in item.stash:
        outcome.get_result().user_properties.append((CPU_KEY, _cpu_seconds() - item.stash[_start]))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    count = config.getoption("--cpu-durations")
    if not count:
        return
    costs = [
        (value, report.nodeid)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "teardown"
        for key, value in getattr(report, "user_properties", ())
        if key == CPU_KEY
    ]
    total = sum(value for value, _ in costs)
    terminalreporter.write_sep("=", f"{count} most CPU-costly tests (of {total:.0f} CPU s)")
    for value, nodeid in sorted(costs, reverse=True)[:count]:
        terminalreporter.write_line(f"{value:8.1f}s cpu  {nodeid}")
