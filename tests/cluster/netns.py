"""Hosts on one machine: network namespaces on a bridge, for tests of what crosses a network.

    cluster = Cluster(workdir).start()             # the bridge (the test's own address .1)
    data = cluster.add_host("data", 2)             # a namespace with eth0 at SUBNET.2
    cluster.add_address(data, 3)                   # a second address on the same host
    cluster.run(data, [...])                       # a process inside it
    cluster.cut(worker) / cluster.restore(worker)  # its link down / up
    cluster.blackhole(web, ip) / cluster.unblackhole(web, ip)   # one route dropped, nothing else
    cluster.stop()                                 # processes, namespaces and the bridge: all gone

Every address is one the test creates, on a /24 of its own; nothing leaves the machine. Names
carry a random tag so that two runs never collide, and `stop()` removes everything even after a
failure (call it in `finally`). `unavailable()` says why a machine cannot do this (not root, no
`ip`, namespaces refused): the tests then skip with that reason.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import ManagedProcess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (Debian's iproute2)"
    probe = f"tp-probe-{secrets.token_hex(3)}"
    result = _ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"`ip netns add` was refused: {result.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    veth: str  # the root side of its link (on the bridge): down cuts the host off
    extra_addresses: list[str] = field(default_factory=list)


class Cluster:
    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.tag = secrets.token_hex(2)
        self.subnet = f"10.250.{random.randint(16, 250)}"
        self.bridge = f"tpbr{self.tag}"
        self.bridge_address = f"{self.subnet}.1"
        self.hosts: dict[str, Host] = {}
        self.processes: list[ManagedProcess] = []
        self.blackholes: list[tuple[Host, str]] = []

    def start(self) -> Cluster:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add_host(self, name: str, last_octet: int) -> Host:
        namespace = f"tp{self.tag}-{name}"
        veth = f"tv{self.tag}{len(self.hosts)}"
        peer = f"{veth}p"
        address = f"{self.subnet}.{last_octet}"
        _ip("netns", "add", namespace)
        host = Host(name, namespace, address, veth)
        self.hosts[name] = host
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", namespace)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "link", "set", peer, "name", "eth0")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        return host

    def add_address(self, host: Host, last_octet: int) -> str:
        address = f"{self.subnet}.{last_octet}"
        _ip("-n", host.namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        host.extra_addresses.append(address)
        return address

    def argv(self, host: Host, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", host.namespace, *argv]

    def process(self, host: Host, name: str, argv: list[str], env: dict[str, str],
                ready_marker: str | None = None) -> ManagedProcess:
        """A process inside `host` (started by the caller), stopped by `stop()`."""
        process = ManagedProcess(name, self.argv(host, argv), env, ready_marker=ready_marker)
        self.processes.append(process)
        return process

    def cut(self, host: Host) -> None:
        """Take the host's link down: it keeps running, and reaches nobody."""
        _ip("link", "set", host.veth, "down")

    def restore(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")

    def blackhole(self, host: Host, address: str) -> None:
        """Drop everything `host` sends to `address` (no reply, as a broken route would)."""
        _ip("-n", host.namespace, "route", "add", "blackhole", f"{address}/32")
        self.blackholes.append((host, address))

    def unblackhole(self, host: Host, address: str) -> None:
        _ip("-n", host.namespace, "route", "del", "blackhole", f"{address}/32")
        self.blackholes.remove((host, address))

    def stop(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop(timeout=10)
        for host in self.hosts.values():
            # Anything still running inside (a child a process left behind) dies with a SIGKILL.
            pids = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True,
                                  timeout=10).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            _ip("netns", "del", host.namespace, check=False)
        _ip("link", "del", self.bridge, check=False)
