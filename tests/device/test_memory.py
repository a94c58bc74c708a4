"""device/runtime/memory.py: glibc's malloc keeps freed blocks for the kernels' next step."""

import ctypes
import ctypes.util
import platform

import pytest

from device.runtime import memory


class _Mallopt:
    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, param, value):
        self.calls.append((param, value))
        return self.answers.pop(0)


class _Libc:
    def __init__(self, answers):
        self.mallopt = _Mallopt(answers)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(memory, "_done", False)


def test_both_thresholds_are_raised_once_per_process(fresh, monkeypatch):
    libc, opened = _Libc([1, 1]), []
    monkeypatch.setattr(ctypes, "CDLL", lambda name: opened.append(name) or libc)
    assert memory.keep_freed_memory() is True
    assert opened == [ctypes.util.find_library("c")]  # the C library, by the name the system gives it
    # the mmap threshold to glibc's 64-bit ceiling, then the trim threshold to 1 GiB (glibc's malloc.h numbers)
    assert libc.mallopt.calls == [(-3, 32 * 1024 * 1024), (-1, 1024 * 1024 * 1024)]
    assert libc.mallopt.argtypes == (ctypes.c_int, ctypes.c_int)
    assert memory.keep_freed_memory() is True
    assert len(libc.mallopt.calls) == 2  # done once


@pytest.mark.parametrize("answers", [[0, 1], [1, 0]])
def test_a_refused_setting_reports_false_and_is_tried_again(fresh, monkeypatch, answers):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _Libc(answers))
    assert memory.keep_freed_memory() is False
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _Libc([1, 1]))
    assert memory.keep_freed_memory() is True


@pytest.mark.parametrize("error", [OSError, AttributeError, TypeError])
def test_nothing_is_done_without_glibcs_mallopt(fresh, monkeypatch, error):
    def cdll(name):
        raise error("no such library")

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    assert memory.keep_freed_memory() is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_glibc_takes_the_setting(fresh):
    assert memory.keep_freed_memory() is True
