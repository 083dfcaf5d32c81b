"""``nvshim cdi refresh``: what nvshim derives from the NVIDIA driver, brought up to date in one go.

After a driver upgrade three things still describe the old driver: the CDI specs the
config's ``cdi-refresh`` lists (each entry the options of ``nvshim cdi generate``), the
node plan cache (:mod:`nvshim.runtime.plancache`) and the index of the CDI spec dirs
(:mod:`nvshim.cdi.index`). :func:`refresh_node`

- stops with one line, writing nothing, when the driver is not there (yet);
- generates every listed spec in memory first: a failing entry writes no spec at all;
- writes each spec whose bytes changed, atomically (readers see the old or the new file);
- rebuilds the compiled config, the plan cache and the index only when they are stale,

all under a lock on the config file (the systemd units, the udev rule and a watcher may
start it at once), and goes round again when the driver changed while it ran. Run twice,
the second run writes nothing.

The way without systemd is :func:`watch`: a poll of :func:`watch_paths` (a few ``stat``
calls and one small procfs read) every few seconds, refreshing when the driver's state
changed and then held still for one interval (an upgrade replaces many files).
"""

from __future__ import annotations

import os

from nvshim._record import dataclass
from nvshim.errors import HostError, NvshimError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional, Sequence, Tuple

    from nvshim.config import Config

__all__ = ["Target", "Refreshed", "refresh_node", "watch_paths", "driver_state", "watch"]

#: How many times one refresh starts over when the driver changes while it runs.
_ROUNDS = 3


@dataclass(frozen=True)
class Target:
    """One ``cdi-refresh`` entry: the spec file and the ``nvshim cdi generate`` options."""

    entry: str
    """The entry as the config writes it."""
    output: str
    class_: str = "gpu"
    vendor: str = "nvidia.com"
    strategies: Tuple[str, ...] = ("index", "uuid")
    capabilities: str = "compute,utility"
    gpu_source: str = "auto"
    hook_path: Optional[str] = None


@dataclass(frozen=True)
class Refreshed:
    """What one :func:`refresh_node` did."""

    version: str
    """The driver version the result describes."""
    written: Tuple[str, ...]
    """One line per thing rewritten (empty: everything was current)."""
    specs: int
    """How many specs ``cdi-refresh`` lists."""
    state: Tuple[Any, ...]
    """:func:`driver_state` after the refresh (the watcher compares with it)."""


def watch_paths(config: Config) -> List[str]:
    """The files whose change means the driver changed: the kernel module's version file
    (procfs: read, not watched by inotify), ``modules.dep``/``.bin`` of the running kernel
    (the host's and, under another driver root, the root's), ``libcuda.so.1`` in each
    library folder of the driver root, and the config itself."""
    from nvshim.host.discovery import LIB_DIRS, Host

    host = Host(config.driver_root, config.dev_root)
    release = os.uname().release
    paths = [host.host_path("/proc/driver/nvidia/version")]
    for root in dict.fromkeys(("/", config.driver_root)):
        base = "" if root == "/" else root.rstrip("/")
        paths += [
            f"{base}/lib/modules/{release}/modules.dep",
            f"{base}/lib/modules/{release}/modules.dep.bin",
        ]
    paths += [host.host_path(f"{directory}/libcuda.so.1") for directory in LIB_DIRS]
    if config.source:
        paths.append(config.source)
    return list(dict.fromkeys(paths))


def _sig(path: str) -> Optional[Tuple[int, ...]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096)
    except OSError:
        return None


def driver_state(config: Config, targets: Sequence[Target] = ()) -> Tuple[Any, ...]:
    """What the driver looks like now, cheaply: the module's version text, the ``stat`` of
    the other :func:`watch_paths`, the GPU entries in procfs, and which target specs exist
    (a spec deleted, e.g. /var/run after a reboot, is written again)."""
    paths = watch_paths(config)
    state: List[Any] = [_read(paths[0])]
    state += [_sig(path) for path in paths[1:]]
    gpus = os.path.join(os.path.dirname(paths[0]), "gpus")
    try:
        state.append(tuple(sorted(os.listdir(gpus))))
    except OSError:
        state.append(None)
    state += [os.path.exists(t.output) for t in targets]
    return tuple(state)


def refresh_node(config: Config, targets: Sequence[Target]) -> Refreshed:
    """Bring the ``targets`` specs, the compiled config, the plan cache and the CDI index up
    to date with the driver (see the module doc). Raises a one-line :class:`NvshimError`,
    having written nothing, when the driver is missing or a spec cannot be made."""
    with _locked(config.source):
        written: List[str] = []
        for _ in range(_ROUNDS):
            before = driver_state(config)
            version, lines = _refresh_once(config, targets)
            written += lines
            if driver_state(config) == before:
                break
        return Refreshed(version, tuple(written), len(targets), driver_state(config, targets))


def _refresh_once(config: Config, targets: Sequence[Target]) -> Tuple[str, List[str]]:
    from nvshim.cdi.write import write_spec
    from nvshim.host.discovery import Host
    from nvshim.node.cdigen import generate_for_node

    try:
        version = Host(config.driver_root, config.dev_root, config.nvml_facts).driver_version()
    except HostError as exc:
        raise HostError(
            f"{exc}: nothing refreshed (the driver is not installed, or its module not loaded, yet)"
        ) from exc
    specs = []
    for target in targets:  # all made before any is written: one failing entry writes none
        try:
            spec, _ = generate_for_node(
                None,
                None,
                target.class_,
                target.vendor,
                target.strategies,
                target.capabilities,
                target.gpu_source,
                target.hook_path,
                config,
            )
        except NvshimError as exc:
            raise type(exc)(
                f"cannot refresh {target.output} (cdi-refresh entry "
                f'"{target.entry}"): {exc}; nothing refreshed'
            ) from exc
        specs.append((target.output, spec))
    lines = [
        f"{output}: regenerated for driver {version}"
        for output, spec in specs
        if write_spec(output, spec)
    ]
    lines += _refresh_caches(config)
    return version, lines


def _refresh_caches(config: Config) -> List[str]:
    """Rewrite the compiled config, the plan cache and the CDI index when stale."""
    from nvshim.cdi import index as cdiindex
    from nvshim.config import cdi_index_path, load_config, plan_path
    from nvshim.host.discovery import Host
    from nvshim.node.compile import compile_config, compiled_fresh
    from nvshim.runtime import plancache

    lines: List[str] = []
    source = config.source
    if source is None:
        return lines  # built-in defaults: no file to keep the caches beside
    if not compiled_fresh(source):
        lines.append(f"compiled config: wrote {compile_config(source)}")
        config = load_config(source)
    live = Host(config.driver_root, config.dev_root, config.nvml_facts)  # its roots, as creates
    cached, _ = plancache.load(plan_path(source), live.driver_root, live.dev_root, live.nvml_facts)
    if cached is None:
        lines.append(f"node plan: {plancache.refresh(config)}")
    index = cdi_index_path(source)
    _, why = cdiindex.load(index, config.cdi_spec_dirs)
    if why:
        lines.append(f"CDI index: {cdiindex.refresh(config.cdi_spec_dirs, index)}")
    return lines


class _locked:
    """An exclusive ``flock`` on the config file for the duration (none without one)."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> None:
        if self.path is None:
            return
        import fcntl

        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return  # loading it already said what is wrong; nothing to serialise on
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the lock
            self.fd = -1


class _Stop(Exception):
    """SIGTERM or SIGINT arrived while the watcher slept."""


def watch(load: Callable[[], Tuple[Config, Sequence[Target]]], interval: float, log: Any) -> None:
    """Refresh now, then whenever :func:`driver_state` changed and held still for one
    ``interval``; return on SIGTERM or SIGINT.

    ``load`` gives the config and targets (read again each round: an edited config is
    followed); ``log`` (a structlog logger, :mod:`nvshim.logs`) gets what each
    refresh wrote as ``info`` events and each new error as an ``error`` event (an error
    repeated round after round is said once).
    """
    import signal
    import time

    sleeping = False
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        if sleeping:
            raise _Stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    done: Optional[Tuple[Any, ...]] = None
    previous: Optional[Tuple[Any, ...]] = None
    last_error = ""
    try:
        while not stopping:
            error = ""
            state: Optional[Tuple[Any, ...]] = None
            try:
                config, targets = load()
                state = driver_state(config, targets)
                if state != done and (done is None or state == previous):
                    result = refresh_node(config, targets)
                    for line in result.written:
                        log.info(line)
                    done = state = result.state
            except NvshimError as exc:
                error = str(exc)
                if error != last_error:
                    log.error(error)
            last_error = error
            previous = state if not error else None
            if stopping:
                break
            sleeping = True
            try:
                time.sleep(interval)
            finally:
                sleeping = False
    except _Stop:
        return
