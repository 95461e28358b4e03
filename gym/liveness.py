"""Which process made something, and whether that process is gone: for MLflow runs a killed process left
RUNNING (tracking.end_orphaned_runs).

    owner = this_process()   # "host|pid-namespace|pid|start time", stored with what the process makes
    gone(owner)              # True only when that process certainly no longer runs

A process is certainly gone when it ran on this host, in this PID namespace (containers sharing a
host name have their own), and its PID is now free or taken by a process that started at another
time. Anything else (another host, another namespace, an unreadable identity) is not known to be
gone: a run on another machine is never touched.
"""

from __future__ import annotations

import functools
import os
import socket

import psutil

SEP = "|"


@functools.cache
def _namespace() -> str:
    """This process's PID namespace (Linux), "" where there is none to read."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def this_process() -> str:
    me = psutil.Process()
    return SEP.join([socket.gethostname(), _namespace(), str(me.pid), f"{me.create_time():.2f}"])


def gone(owner: str) -> bool:
    try:
        host, namespace, pid, started = owner.split(SEP)
        pid_number, start_time = int(pid), float(started)
    except ValueError:
        return False
    if host != socket.gethostname() or namespace != _namespace():
        return False
    try:
        return abs(psutil.Process(pid_number).create_time() - start_time) > 0.05
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # exists but can't be read (another user's): not known to be gone
        return False
