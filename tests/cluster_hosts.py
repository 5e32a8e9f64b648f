"""Separate hosts on one machine, for a real Ray cluster brought up by Ray's launcher.

Each host is what Ray's local provider needs of a machine and what ``ray stop`` must not
see past: its own address on loopback (127.0.0.2, .3, ...), its own OpenSSH server on that
address, its own Unix user (the one login name the launcher uses everywhere, ``raypeft``,
with a uid of the host's own) and home, its own ``/tmp`` and ``/dev/shm``, and its own
process namespace.

How: the host's first process is ``unshare --pid --mount --fork --mount-proc`` running
:data:`INIT` as PID 1 of a new PID namespace with a private mount namespace. Before it
starts the host's ``sshd`` it bind-mounts, inside that namespace only, a ``passwd`` file
that maps ``raypeft`` to the host's uid and home folder, the home folder on
``/home/raypeft``, and fresh folders on ``/tmp`` and ``/dev/shm``. Everything that logs in
over SSH, so everything ``ray up`` starts there, lives in that namespace: ``ray stop`` (which
looks for Ray processes in ``/proc``) sees only the host's own processes, and the host's
user could not signal another host's processes even if it saw them (another uid).

Why not network namespaces: a host's only network would then be its own ``lo``, and
joining hosts needs veth pairs with private addresses; the cluster's traffic stays on
127.0.0.0/8 instead, so every host shares the machine's loopback and Ray's ports that are
not random are chosen per host (the dashboard agent's; see :data:`HOST_PORTS`).

Why PID 1 is a small Python program rather than sshd itself: a PID namespace's init
inherits every orphan (Ray daemonises its processes), and must reap them; and ending it is
the way to end the host: the kernel kills every process left in a namespace whose init
exits, so teardown cannot leave a node's process behind. Signals from outside reach the
init only through the handlers it installs (SIGTERM here).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

LOGIN = "raypeft"  # the launcher's auth.ssh_user: one name on every host
# Each host's sshd listens on a port of its own, not 22: an ordinary Linux host runs its own
# sshd on 0.0.0.0:22, which answers every 127.0.0.x:22 (and keeps a host's sshd from binding
# it). Every ssh client of the cluster (the laptop's `ray up`, the head's autoscaler, the
# tests) finds the port in its ssh config (:func:`ssh_config`), as a team with SSH on
# another port writes it.
SSH_PORT_BASE = 22000
HOME_INSIDE = Path("/home") / LOGIN  # where each host sees its own home folder
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
SSH_OPTIONS += ["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]

# PID 1 of a host: argv[1] is the host's folder (passwd, home, tmp, sshd_config).
INIT = r"""
import os, signal, subprocess, sys, time

root = sys.argv[1]
for source, target in (("passwd", "/etc/passwd"), ("home", "/home/raypeft"), ("tmp", "/tmp")):
    subprocess.run(["mount", "--bind", os.path.join(root, source), target], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,size=4g", "tmpfs", "/dev/shm"], check=True)
os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", os.path.join(root, "sshd_config")])


def end(*_):
    # every process of this namespace: Ray's, the MLflow server's, sshd's; then exit, and the
    # kernel kills whatever is left
    os.kill(-1, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        time.sleep(0.1)
    os._exit(0)


signal.signal(signal.SIGTERM, end)
while True:
    try:
        pid, _ = os.wait()  # reap every orphan of the namespace
    except ChildProcessError:
        time.sleep(1)
        continue
    if pid == sshd.pid:
        end()
"""


def ssh_port(address: str) -> int:
    """The port of the sshd of the host at ``address`` (127.0.0.N: 22000 + N)."""
    return SSH_PORT_BASE + int(address.rsplit(".", 1)[1])


def ssh_config(addresses: list[str]) -> str:
    """An ssh client config naming each host's port (a user's ~/.ssh/config)."""
    return "".join(f"Host {a}\n  Port {ssh_port(a)}\n" for a in addresses)


@dataclass
class Host:
    """One host: ``address`` on loopback, its folder ``root`` on this machine (seen from
    outside), its ``uid``, and ``init``, PID 1 of its namespace as this machine sees it."""

    name: str
    address: str
    root: Path
    uid: int
    init: psutil.Process
    pid_namespace: str  # /proc/PID/ns/pid of its processes: kept, it outlives the init's pid

    @property
    def home(self) -> Path:
        """The host's home folder, as the test (outside the host) reaches it."""
        return self.root / "home"

    def processes(self) -> list[psutil.Process]:
        """Every live process of the host (its namespace), its init and sshd listener included."""
        mine = self.pid_namespace
        found = []
        for proc in psutil.process_iter(["status"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if os.readlink(f"/proc/{proc.pid}/ns/pid") == mine:
                    found.append(proc)
            except OSError:  # ended meanwhile
                continue
        return found

    def user_processes(self) -> list[psutil.Process]:
        """What runs as the host's user: what logged in over SSH started (not sshd's own)."""
        found = []
        for proc in self.processes():
            try:
                if proc.uids().real == self.uid and not proc.name().startswith("sshd"):
                    found.append(proc)
            except psutil.NoSuchProcess:
                continue
        return found

    def named(self, name: str) -> list[psutil.Process]:
        """The host's processes whose executable name is ``name`` (gcs_server, raylet, ...)."""
        found = []
        for proc in self.user_processes():
            try:
                if proc.name() == name:
                    found.append(proc)
            except psutil.NoSuchProcess:
                continue
        return found

    def ssh(self, key: Path, command: str, timeout=300) -> subprocess.CompletedProcess:
        """``command`` on the host in a login shell with ~/.bashrc, as the launcher runs it."""
        import shlex

        return subprocess.run(
            ["ssh", "-i", str(key), *SSH_OPTIONS, "-p", str(ssh_port(self.address))]
            + [f"{LOGIN}@{self.address}"]
            + [f"bash --login -c -i {shlex.quote('source ~/.bashrc; ' + command)}"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def end(self) -> None:
        """End the host: its init stops every process of its namespace, then exits."""
        end_hosts([self])


def end_hosts(hosts: list[Host]) -> None:
    """End several hosts at once (each init stops its namespace's processes, then exits)."""
    for host in hosts:
        try:
            host.init.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    for host in hosts:
        try:
            host.init.wait(timeout=30)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            host.init.kill()  # the kernel then kills the namespace's every process
            host.init.wait(timeout=30)


def _passwd(uid: int) -> str:
    """This machine's /etc/passwd with :data:`LOGIN` as the host's own user."""
    lines = [
        line
        for line in Path("/etc/passwd").read_text().splitlines()
        if not line.startswith(f"{LOGIN}:")
    ]
    # "*": no password, yet not a locked account (sshd lets the key in without PAM)
    lines.append(f"{LOGIN}:*:{uid}:{uid}::{HOME_INSIDE}:/bin/bash")
    return "\n".join(lines) + "\n"


def _sshd_config(root: Path, address: str) -> str:
    return (
        f"ListenAddress {address}:{ssh_port(address)}\nHostKey {root / 'host_key'}\nPidFile none\n"
        f"AllowUsers {LOGIN}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nUsePAM no\nPermitRootLogin no\nAllowTcpForwarding yes\n"
        # the host folders are made by root under a folder of the test's: not the home's
        # ownership chain sshd's StrictModes checks
        "StrictModes no\n"
    )


def _wait_for_sshd(address: str, init: psutil.Process, log: Path) -> None:
    """Until the host's own sshd listens on its address and port: the listener is a process
    of the host's namespace (another sshd answering there would be the machine's)."""
    namespace = os.readlink(f"/proc/{init.pid}/ns/pid")
    port = ssh_port(address)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and init.is_running():
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status != psutil.CONN_LISTEN or conn.laddr.port != port:
                continue
            if conn.laddr.ip not in (address, "0.0.0.0", "::"):
                continue
            try:
                owner = os.readlink(f"/proc/{conn.pid}/ns/pid") if conn.pid else None
            except OSError:
                owner = None
            if owner != namespace:
                raise RuntimeError(
                    f"{address}:{port} is answered by another process (pid {conn.pid}), not "
                    "the host's own sshd"
                )
            return
        time.sleep(0.2)
    raise RuntimeError(f"sshd on {address}:{port} did not start: {log.read_text()[-500:]}")


def start_host(
    name: str, address: str, root: Path, uid: int, public_key: str, peers: list[str]
) -> Host:
    """A new host (see the module's docstring) whose user lets ``public_key`` log in and
    reaches the sshd of each of ``peers`` (addresses) at its port."""
    root.mkdir(parents=True)
    root.chmod(0o755)
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "authorized_keys").write_text(public_key)
    (home / ".ssh" / "config").write_text(ssh_config(peers))
    (home / ".ssh" / "config").chmod(0o600)
    (root / "tmp").mkdir(mode=0o1777)
    (root / "tmp").chmod(0o1777)
    for path in [home, home / ".ssh", *home.rglob("*")]:
        os.chown(path, uid, uid)
    (home / ".ssh").chmod(0o700)
    (root / "passwd").write_text(_passwd(uid))
    (root / "passwd").chmod(0o644)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", root / "host_key"], check=True
    )
    (root / "sshd_config").write_text(_sshd_config(root, address))
    (root / "init.py").write_text(INIT)
    HOME_INSIDE.mkdir(parents=True, exist_ok=True)  # the mount point every host binds over
    log = root / "host.log"
    unshare = subprocess.Popen(
        ["unshare", "--pid", "--mount", "--fork", "--mount-proc"]
        + [sys.executable, str(root / "init.py"), str(root)],
        stdout=open(log, "w"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not (kids := psutil.Process(unshare.pid).children()):
        if time.monotonic() > deadline or unshare.poll() is not None:
            raise RuntimeError(f"host {name} did not start: {log.read_text()[-500:]}")
        time.sleep(0.05)
    init = kids[0]
    host = Host(name, address, root, uid, init, os.readlink(f"/proc/{init.pid}/ns/pid"))
    _wait_for_sshd(address, host.init, log)
    return host


# what the hosts run, and the Debian package that has it
HOST_TOOLS = {
    "/usr/sbin/sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
    "unshare": "util-linux",
    "git": "git",
}


def why_hosts_cannot_run() -> tuple[str | None, str] | None:
    """None when this machine can make hosts; else (the missing Debian package, or None
    when it is not a package, and why)."""
    if os.geteuid() != 0:
        return None, "hosts need root (namespaces, bind mounts, a uid per host)"
    for tool, package in HOST_TOOLS.items():
        if not shutil.which(tool):
            return package, f"{tool} is not installed"
    probe = subprocess.run(
        ["unshare", "--pid", "--mount", "--fork", "--mount-proc", "true"], capture_output=True
    )
    if probe.returncode != 0:
        return None, f"unshare --pid --mount cannot run here: {probe.stderr.decode()[-200:]}"
    return None


@contextmanager
def system_sshd(root: Path) -> Iterator[int | None]:
    """An ordinary Linux host's sshd on 0.0.0.0:22 for the block, where this machine has
    none: it answers every 127.0.0.x:22, so a cluster client that reached for port 22
    instead of its host's own would meet it and be refused (it lets no one in). Yields its
    pid, or None where something already listens on port 22 (the machine's own sshd)."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 22)) == 0:
            yield None
            return
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", root / "host_key"], check=True
    )
    (root / "sshd_config").write_text(
        f"ListenAddress 0.0.0.0:22\nHostKey {root / 'host_key'}\nPidFile none\n"
        "AllowUsers nobody-logs-in-here\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin no\nUsePAM no\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    sshd = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(root / "sshd_config")],
        stdout=open(root / "sshd.log", "w"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", 22)) == 0:
                    break
            if sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the system-like sshd did not start: {sshd.returncode}")
            time.sleep(0.1)
        yield sshd.pid
    finally:
        sshd.terminate()
        sshd.wait(timeout=30)
