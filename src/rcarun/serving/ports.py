"""Who holds a TCP port, and whose replica a process is: the identity checks behind managed replicas.

A port that answers ``/health`` proves nothing about who answers, so every replica carries `MARKER` (rcarun's
pid and start time) in its environment, and on Linux a port's holders are found through ``/proc``; where it is
missing they are unknown (None). Why: docs/reliability.md ("Managed replicas").
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rcarun.serving.spec import ServeError

__all__ = [
    "MARKER",
    "PortHolder",
    "choose_ports",
    "claim_port",
    "end_marked",
    "identity_alive",
    "port_free",
    "port_holders",
    "process_identity",
    "running",
    "stranger_on",
    "who",
]

MARKER = "RCARUN_REPLICA_OF"
"""The environment variable naming the rcarun process that started a replica: ``<pid>:<start time>``."""

_PROC = Path("/proc")
_LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket
_COMMAND_CHARS = 160
# How long the processes of a stale replica, once SIGKILLed, may take to end and close their sockets.
_STALE_GONE_S = 10.0
# How long a port whose socket no visible process holds may take to close (its holder was exiting).
_HOLDER_EXITING_S = 1.0

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
    """The processes this user may see holding a socket listening on ``port`` at ``host`` or a wildcard ([] for
    none seen, None without ``/proc``)."""
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
    """SIGKILL every process whose `MARKER` names ``owner``; return the pids signalled."""
    ended = []
    for pid in _pids():
        if _marker(pid) == owner:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
    return ended


def who(holder: PortHolder) -> str:
    """A port's holder in a few words: which process, and whose replica it is if it is one."""
    if holder.owner is None:
        return f"{holder.describe()}, which rcarun did not start"
    rcarun_pid = holder.owner.partition(":")[0]
    if rcarun_pid == str(os.getpid()):
        return f"{holder.describe()}, a process of this rcarun's replicas"
    return f"{holder.describe()}, a replica of rcarun pid {rcarun_pid}, which still runs"


def stranger_on(host: str, port: int, pgid: int) -> str | None:
    """Who, other than process group ``pgid``, holds the socket on ``host:port``; None when only that group
    does, or where ``/proc`` is missing (then a replica's exit is all that is known)."""
    holders = port_holders(host, port)
    if holders is None:
        return None
    strangers = [holder for holder in holders if holder.pgid != pgid]
    if holders and not strangers:
        return None
    return who(strangers[0]) if strangers else "a process this user cannot see"


def choose_ports(host: str, port_base: int | None, count: int) -> tuple[int, ...]:
    """``port_base + i`` per replica, or free ports the system hands out (all held open while choosing)."""
    if port_base is not None:
        return tuple(port_base + index for index in range(count))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return tuple(int(sock.getsockname()[1]) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


async def _port_freed(host: str, port: int, within_s: float, poll_s: float) -> bool:
    """Whether ``host:port`` is free now or becomes free within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not await asyncio.to_thread(port_free, host, port):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


async def claim_port(
    host: str, port: int, where: str, *, poll_s: float, on_ended: Callable[[str, list[int], str], None]
) -> None:
    """Make ``host:port`` free: end a replica a killed rcarun left there (``on_ended`` hears it), else raise a
    `ServeError` starting with ``where`` and naming the holder."""
    if await asyncio.to_thread(port_free, host, port):
        return
    holders = await asyncio.to_thread(port_holders, host, port)
    if holders is None:
        raise ServeError(f"{where}; stop what listens there or change port_base")
    if not holders:
        # A process dying at this moment still shows its socket but no longer its descriptors.
        if await _port_freed(host, port, _HOLDER_EXITING_S, poll_s):
            return
        raise ServeError(f"{where} by a process this user cannot see; stop it or change port_base")
    live = [holder for holder in holders if not holder.stale]
    if live:
        raise ServeError(f"{where} by {who(live[0])}; stop it or change port_base")
    ended: list[int] = []
    for owner in sorted({holder.owner for holder in holders if holder.owner is not None}):
        pids = await asyncio.to_thread(end_marked, owner)
        ended += pids
        on_ended(owner, pids, holders[0].command)
    # Every process ended, not only this port's holder, so that the next replica's port is free too.
    deadline = time.monotonic() + _STALE_GONE_S
    while any(running(pid) for pid in ended) and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
    if not await _port_freed(host, port, max(0.0, deadline - time.monotonic()), poll_s):
        raise ServeError(f"{where}: a stale replica's socket is still open {_STALE_GONE_S:g} s after SIGKILL")


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
