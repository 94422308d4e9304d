"""Who holds a TCP port, and whose replica a process is: the identity checks behind managed replicas.

A port that answers ``/health`` proves nothing about who answers: an orphan of a killed run, or any other
server, may hold it. So every replica rcarun starts carries `MARKER` in its environment (rcarun's pid and its
start time: a pid alone may be reused), and on Linux the listening socket of a port is found in
``/proc/net/tcp`` and ``tcp6`` and its processes among ``/proc/*/fd`` (only this user's processes can be seen;
someone else's server shows as a socket without a holder). That tells a replica of this run from one left by a
run that no longer exists, and both from a server of someone else's. Where ``/proc`` is missing the holders
are unknown (None) and the callers say so.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MARKER",
    "PortHolder",
    "end_marked",
    "identity_alive",
    "port_free",
    "port_holders",
    "process_identity",
    "running",
]

MARKER = "RCARUN_REPLICA_OF"
"""The environment variable naming the rcarun process that started a replica: ``<pid>:<start time>``."""

_PROC = Path("/proc")
_LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket
_COMMAND_CHARS = 160

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class PortHolder:
    """A process holding a listening socket: its group, its command line (cut) and whose replica it is."""

    pid: int
    pgid: int
    command: str
    owner: str | None  # the MARKER value: the rcarun that started it; None for any other process

    @property
    def stale(self) -> bool:
        """A replica whose rcarun no longer runs (killed): nobody will stop it."""
        return self.owner is not None and not identity_alive(self.owner)

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"


def process_identity(pid: int) -> str:
    """``<pid>:<start time in clock ticks>``, which no later process can share (``?`` where unknown)."""
    start = _start_ticks(pid)
    return f"{pid}:{'?' if start is None else start}"


def identity_alive(identity: str) -> bool:
    """Whether the process a `process_identity` names still runs (a zombie does not)."""
    pid_text, _, start = identity.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if not running(pid):
        return False
    stat = _stat_fields(pid)
    return stat is None or start == "?" or stat[19] == start


def running(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (dead, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _stat_fields(pid)
    return stat is None or stat[0] != "Z"


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (a socket only lingering in TIME_WAIT does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            # Any other refusal (an address not of this machine, a privileged port) is the server's to report.
            return exc.errno != errno.EADDRINUSE
    return True


def port_holders(host: str, port: int) -> list[PortHolder] | None:
    """The processes holding a socket that listens on ``port`` at ``host``'s address or at a wildcard.

    Returns:
        One entry per process that this user may see; an empty list when the socket's holder cannot be seen
        (another user's process) or nothing listens; None where ``/proc`` is missing (not Linux).
    """
    inodes = _listening_inodes(host, port)
    if inodes is None:
        return None
    if not inodes:
        return []
    targets = {f"socket:[{inode}]" for inode in inodes}
    holders = []
    for pid in _pids():
        if not _holds(pid, targets):
            continue
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            continue
        holders.append(PortHolder(pid=pid, pgid=pgid, command=_command(pid), owner=_marker(pid)))
    return holders


def end_marked(owner: str) -> list[int]:
    """SIGKILL every process whose `MARKER` names ``owner`` (a replica's leader, its workers, its guard).

    Returns:
        The pids signalled.
    """
    ended = []
    for pid in _pids():
        if _marker(pid) == owner:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
    return ended


# ------------------------------------------------------------------------------------------------ internals


def _pids() -> list[int]:
    try:
        return [int(entry.name) for entry in os.scandir(_PROC) if entry.name.isdigit()]
    except OSError:
        return []


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name: [0] is the state, [19] the start time."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields if len(fields) > 19 else None


def _start_ticks(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return None if fields is None else fields[19]


def _marker(pid: int) -> str | None:
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = MARKER.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def _command(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 3] + "..."


def _holds(pid: int, targets: set[str]) -> bool:
    try:
        with os.scandir(_PROC / str(pid) / "fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) in targets:
                        return True
    except OSError:
        pass
    return False


def _listening_inodes(host: str, port: int) -> set[int] | None:
    """Inodes of the sockets listening on ``port`` at an address a connection to ``host`` may reach."""
    tables = [_PROC / "net" / "tcp", _PROC / "net" / "tcp6"]
    if not tables[0].exists():
        return None
    try:
        wanted = {
            _normal(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
            for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        }
    except (OSError, ValueError):
        wanted = set()
    anywhere = not wanted or any(address.is_unspecified for address in wanted)
    inodes = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address_hex, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) != port:
                continue
            address = _proc_address(address_hex)
            if anywhere or address.is_unspecified or address in wanted:
                inodes.add(int(fields[9]))
    return inodes


def _proc_address(text: str) -> IPAddress:
    """An address as /proc/net/tcp{,6} writes it: hex, each 32-bit word in the machine's byte order."""
    raw = bytes.fromhex(text)
    if sys.byteorder == "little":
        raw = b"".join(raw[start : start + 4][::-1] for start in range(0, len(raw), 4))
    address: IPAddress = ipaddress.IPv4Address(raw) if len(raw) == 4 else ipaddress.IPv6Address(raw)
    return _normal(address)


def _normal(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
