"""Starting or joining Ray for a search."""

from __future__ import annotations

import contextlib
import logging
import os
import socket

import ray

from raypeft.errors import ConfigError

# Ray binds every server of a node (GCS, raylet, object manager, workers, agents, metrics)
# to the node's IP address, and to loopback only when that address is loopback. ray.init()
# turns _node_ip_address="127.0.0.1" into the machine's external address, so a local Ray is
# given the loopback address as Ray does for single-machine Ray on macOS and Windows.
_SINGLE_MACHINE_RAY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_node():
    """While a local Ray starts: its node address is 127.0.0.1, so it listens on loopback."""
    # why: a private module, touched only here; what Ray does with the flag and its variable
    # is pinned by tests/unit/test_private_reliance.py, the sockets by test_security.py
    from ray._private import ray_constants

    before_env = os.environ.get(_SINGLE_MACHINE_RAY)
    before_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_SINGLE_MACHINE_RAY] = "0"  # the processes Ray starts
    ray_constants.ENABLE_RAY_CLUSTER = False  # this one (read when ray was imported)
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_flag
        if before_env is None:
            os.environ.pop(_SINGLE_MACHINE_RAY, None)
        else:
            os.environ[_SINGLE_MACHINE_RAY] = before_env


def init_ray(address: str | None, quiet: bool = False) -> None:
    """Connect to a cluster (``address``) or start a local Ray with this machine's CPUs."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Tune's newer console output ignores verbose=0; raypeft prints its own progress table
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Tune forces an experiment snapshot at a trial's end and the experiment's (raypeft's
    # searches set no num_to_keep: raypeft.search.superseded); two close together are
    # expected, not worth a warning.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # A diverged trial's last result carries the failure, not the metric (raypeft.training.loop):
    # every other result has it, and the schedulers and searcher skip results without it.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    if ray.is_initialized():
        return
    if quiet:  # --quiet: the summary only, no Ray/Tune chatter
        logging.getLogger("ray").setLevel(logging.ERROR)
    level = logging.ERROR if quiet else logging.WARNING
    if address:
        _join(address, level)
    else:
        with _loopback_node():  # one machine's Ray: nothing listens beyond loopback
            ray.init(
                # "local": always a fresh instance, never a cluster `ray start` left running
                # here (ray.init() with no address would silently join it)
                address="local",
                num_cpus=os.cpu_count(),
                include_dashboard=False,
                log_to_driver=False,
                logging_level=level,
            )


def check_address(address: str) -> None:
    """``--address`` must name a Ray cluster as ``ray.init`` takes one: ``host:port`` (the
    head's GCS), ``ray://host[:port]`` (Ray Client), or ``auto``. Anything else is one line
    here: ray.init would raise its own traceback. Syntax only; whether a cluster answers
    there is asked when the search joins it (:func:`init_ray`)."""
    if address in ("auto", "local"):
        return
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    host, colon, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 host is written [::1]:6379
    good_port = (client and not colon) or (port.isdigit() and 0 < int(port) < 65536)
    good_host = bool(host) and not any(c.isspace() or c in "/?#@" for c in host)
    if not (good_host and good_port):
        raise ConfigError(
            f"--address {address!r}: not a Ray cluster's address; it must be the head's "
            "host:port (e.g. 10.0.0.5:6379), ray://host:10001 or auto"
        )


def _join(address: str, level: int) -> None:
    """Join the Ray cluster at ``address``; a cluster that does not answer there (a wrong
    address or port, a head not started, another cluster's token) is the user's one line."""
    check_address(address)
    _check_something_listens(address)
    try:
        ray.init(address=address, log_to_driver=False, logging_level=level)
    except ConnectionError as exc:  # what ray.init raises when the cluster refuses the driver
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"--address {address}: no Ray cluster could be joined there ({reason})"
        ) from None


def _check_something_listens(address: str) -> None:
    """A ``host:port`` address where nothing accepts a connection fails at once: ray.init
    would retry it for minutes before giving up. ``auto`` and ``ray://`` addresses pass."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise ConfigError(
            f"--address {address}: nothing accepts connections there ({exc.strerror or exc}); "
            "start the cluster's head (`ray start --head` or `ray up`) or give its GCS address"
        ) from None
