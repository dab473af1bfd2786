"""kvstore.log and ext/core/log.c in this process: the line format, one line per call
(control characters escaped), level filtering, Python's records through the same writer,
reopen after a rename, refusals. The log is process-wide: each test puts it back on stderr."""
import logging
import os
import re

import pytest

from kvstore import errors, log

LINE = re.compile(r"^(\d+):M \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2}\.\d{3} ([.\-*#]) (.*)$")


@pytest.fixture
def logfile(tmp_path):
    path = str(tmp_path / "kv.log")
    yield path
    log.configure("notice", "")


def lines(path):
    with open(path) as f:
        out = [LINE.match(x) for x in f.read().splitlines()]
    assert all(out), out
    return [(int(m.group(1)), m.group(2), m.group(3)) for m in out]


def test_python_records_become_log_lines_filtered_by_level(logfile):
    log.configure("verbose", logfile)
    log.logger.debug("not written")
    log.logger.log(log.VERBOSE, "verbose %d", 1)
    log.logger.info("notice\nwith a newline")
    log.logger.warning("warning")
    got = lines(logfile)
    assert [(lc, msg) for _, lc, msg in got] == [("-", "verbose 1"), ("*", "notice\\x0awith a newline"),
                                                 ("#", "warning")]
    assert {pid for pid, _, _ in got} == {os.getpid()}


def test_an_exception_stays_on_one_line(logfile):
    log.configure("notice", logfile)
    try:
        raise ValueError("boom")
    except ValueError:
        log.logger.exception("failed")
    (_, lc, msg), = lines(logfile)
    assert lc == "#" and msg.startswith("failed | Traceback") and "ValueError: boom" in msg


def test_reopen_after_rename(logfile):
    log.configure("notice", logfile)
    log.logger.info("before")
    os.rename(logfile, logfile + ".1")
    log.logger.info("into the renamed file")
    log.reopen()
    log.logger.info("after")
    assert [m for _, _, m in lines(logfile + ".1")] == ["before", "into the renamed file"]
    assert [m for _, _, m in lines(logfile)] == ["after"]


def test_refusals_leave_the_log_where_it_was(logfile, tmp_path):
    log.configure("notice", logfile)
    with pytest.raises(errors.ConfigError, match="log_level: expected one of debug, verbose, notice, warning"):
        log.configure("loud", logfile)
    with pytest.raises(errors.KVError, match="cannot open log file .*/no/such/dir/x.log"):
        log.configure("notice", str(tmp_path / "no" / "such" / "dir" / "x.log"))
    log.logger.info("still here")
    assert [m for _, _, m in lines(logfile)] == ["still here"]


def test_c_levels_match_the_settings_order():
    assert log.LEVELS == ("debug", "verbose", "notice", "warning")
    assert [log.c_level(x) for x in (logging.DEBUG, log.VERBOSE, logging.INFO, logging.WARNING, logging.ERROR)] \
        == [0, 1, 2, 3, 3]
