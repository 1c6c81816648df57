"""Hosts for a test without extra machines: Linux network namespaces on one bridge.

Each host is a network namespace with its own address (10.<n>.0.<i>/24, a veth pair to the
bridge), no loopback shared with the others; its processes run with their own hostname
(a UTS namespace), HOME, PREFECT_HOME and working directory, and a mount namespace in
which the folders it must not read (the client's) are hidden under an empty tmpfs. The
test's own process reaches every host through the bridge's address (10.<n>.0.1).

Needs root and ``ip``/``unshare`` (util-linux); `available` says whether they are here.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The hosts' processes yield to the rest of the test suite, CPU and disk (they are many,
#: on few cores;
#: at 5, the shared server's tests beside them waited past their limits).
NICE = 15


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"ptprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Host:
    """One "machine": a namespace, an address, a hostname, a home folder."""

    name: str
    ns: str
    address: str
    home: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, argv: Sequence[str], env: dict[str, str], hide: Sequence[Path] = (),
              log: str = "process") -> subprocess.Popen[bytes]:
        """Run ``argv`` on this host (in its home folder, with only ``env`` and the home's
        HOME/PREFECT_HOME), ``hide`` mounted over by empty folders; output to a log in
        its home."""
        hidden = " && ".join(f"mount -t tmpfs none {shlex.quote(str(p))}" for p in hide)
        script = " && ".join(filter(None, [f"hostname {self.name}", hidden, 'exec "$@"']))
        full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
                "PREFECT_HOME": str(self.home / ".prefect"), **env}
        out = (self.home / f"{log}.log").open("ab")
        proc = subprocess.Popen(
            ["nice", "-n", str(NICE), "ionice", "-c", "3", "ip", "netns", "exec", self.ns, "unshare", "--uts",
             "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
            env=full, cwd=self.home, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def log(self, name: str = "process") -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@contextlib.contextmanager
def network(root: Path, names: Sequence[str]) -> Iterator[dict[str, Host]]:
    """Hosts ``names`` on a bridge of their own, by name (this process reaches them
    through the bridge's address)."""
    tag = uuid.uuid4().hex[:5]
    subnet = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:4], 16)}"
    bridge = f"ptbr{tag}"
    hosts: dict[str, Host] = {}
    _ip("link", "add", bridge, "type", "bridge")
    try:
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names, start=2):
            hosts[name] = _host(root, tag, subnet, bridge, i, name)
        yield hosts
    finally:
        for host in hosts.values():
            host.stop()
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _host(root: Path, tag: str, subnet: str, bridge: str, i: int, name: str) -> Host:
    ns, inside, outside = f"pt{tag}{i}", f"ptv{tag}{i}", f"ptb{tag}{i}"
    _ip("netns", "add", ns)
    _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
    _ip("link", "set", outside, "master", bridge, "up")
    _ip("link", "set", inside, "netns", ns)
    _ip("-n", ns, "addr", "add", f"{subnet}.{i}/24", "dev", inside)
    _ip("-n", ns, "link", "set", inside, "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    home = root / name
    home.mkdir(parents=True)
    return Host(name, ns, f"{subnet}.{i}", home)
