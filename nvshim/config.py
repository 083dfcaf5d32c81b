"""nvshim's own configuration: ``/etc/nvshim/config.yaml`` (or ``$NVSHIM_CONFIG``).

Here: every key and its default (:class:`Config`), the files kept beside the config
(compiled copy, trampoline lists, plan cache, CDI index) and :func:`load_config`. Two ways
in, one result:

* the hot path reads ``<stem>.compiled.json`` next to the YAML, written by
  ``nvshim config compile``; it holds the validated values and the YAML text it came
  from, so an edited YAML is noticed and the checked path is taken instead;
* the checked path (:mod:`nvshim.configcheck`, imported only then) parses the YAML and
  validates it against ``config/nvshim.schema.json`` with jsonschema; every unknown key
  and bad value is found in one pass and reported in one line.

Every file is read under the trust rule of :mod:`nvshim.files` (owned by root, writable
by root only, in directories only root can change).

A missing file means defaults, except to a create whose config was named
(:func:`config_named`): that fails. The runtime never writes the compiled file itself; the
only file a create may write next to it is the node plan cache (:mod:`nvshim.runtime.plancache`).
"""

from __future__ import annotations

import os

from nvshim import __version__
from nvshim._record import dataclass, fields
from nvshim.errors import ConfigError
from nvshim.files import check_trusted, read_bytes

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional, Tuple

__all__ = [
    "Config",
    "DEFAULT_CONFIG_PATH",
    "config_path",
    "config_named",
    "describe_config",
    "compiled_path",
    "runtimes_path",
    "prefixes_path",
    "plan_path",
    "source_link_path",
    "default_mark_path",
    "compiled_lists_fresh",
    "cdi_index_path",
    "load_config",
    "parse_config_text",
    "compiled_matches",
    "ALL_CAPABILITIES",
    "DEFAULT_CAPABILITIES",
    "DEFAULT_CDI_SPEC_DIRS",
]

DEFAULT_CONFIG_PATH = "/etc/nvshim/config.yaml"

#: Every driver capability (NVIDIA_DRIVER_CAPABILITIES), sorted: the one list of them. The
#: config schema's enum and discovery's per-capability tables are kept equal to it by
#: tests/unit/host/test_capabilities.py.
ALL_CAPABILITIES = ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")
#: What a container granted a GPU gets when NVIDIA_DRIVER_CAPABILITIES is unset or empty
#: (and what ``nvshim cdi generate`` puts in a spec by default).
DEFAULT_CAPABILITIES = ("compute", "utility")

#: Where CDI specs live (CDI's own default), lowest priority first: a later directory
#: overrides. The default of ``cdi-spec-dirs``, of ``nvshim cdi list`` and of the spec
#: dirs ``nvshim runtime configure --enable-cdi`` gives containerd.
DEFAULT_CDI_SPEC_DIRS: Tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class Config:
    """Validated configuration. Attribute names are the YAML keys with ``_`` for ``-``."""

    runtimes: Tuple[str, ...] = ("runc", "crun")
    debug_log: Optional[str] = None
    driver_root: str = "/"
    dev_root: Optional[str] = None
    nvml_facts: Optional[str] = None
    accept_envvar_when_unprivileged: bool = True
    require_allocation: bool = False
    allocation_sources: Tuple[str, ...] = (
        "volume-mounts",
        "cdi-annotations",
        "docker-gpus",
        "envvar-uuids",
        "privileged",
    )
    on_missing_allocation: str = "strip"
    require_allocation_features: Tuple[str, ...] = ("gds", "gdrcopy")
    accept_all_from_mounts: bool = False
    management_pods: Tuple[str, ...] = ()
    verify_with: str = "none"
    kubelet_unreachable: str = "fail"
    unidentified_containers: str = "fail"
    kubelet_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    kubelet_checkpoint: Optional[str] = (
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    )
    kubelet_timeout: float = 2.0
    kubelet_resource_prefixes: Tuple[str, ...] = ("nvidia.com/",)
    grants_journal: Optional[str] = "/var/lib/nvshim/grants.jsonl"
    grants_journal_max_bytes: int = 1048576
    annotation_prefixes: Tuple[str, ...] = ("cdi.k8s.io/",)
    cdi_spec_dirs: Tuple[str, ...] = DEFAULT_CDI_SPEC_DIRS
    cdi_refresh: Tuple[str, ...] = ()
    default_kind: str = "nvidia.com/gpu"
    stale_cdi_spec: str = "warn"
    engine_grants: str = "exclusive"
    nri_inject: bool = False
    nri_guard: bool = True
    nri_verify: bool = True
    nri_inroot: str = "agent"
    nri_gpu_handlers: Tuple[str, ...] = ("nvidia", "nvidia-cdi", "nvidia-legacy")
    nri_nvshim_handlers: Tuple[str, ...] = ("nvshim",)
    nri_runtime_root: str = "/run/containerd/runc/k8s.io"
    supported_driver_capabilities: Tuple[str, ...] = ALL_CAPABILITIES
    disable_require: bool = False
    disable_device_node_modification: bool = True
    source: Optional[str] = None
    """The file these values came from (None = built-in defaults)."""

    def to_mapping(self) -> Dict[str, Any]:
        """The YAML-shaped mapping (kebab-case keys) of these values."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            if f.name == "source":
                continue
            value = getattr(self, f.name)
            out[f.name.replace("_", "-")] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: Optional[str]) -> "Config":
        """Build from an already validated mapping (kebab-case keys)."""
        kwargs: Dict[str, Any] = {"source": source}
        for key, value in data.items():
            name = key.replace("-", "_")
            kwargs[name] = tuple(value) if isinstance(value, list) else value
        return cls(**kwargs)


#: Set by the installed trampoline's boot (install.sh always writes the config it embeds):
#: then :data:`DEFAULT_CONFIG_PATH` is a named config, see :func:`config_named`.
DEFAULT_CONFIG_NAMED = False


def config_path(environ: Optional[Mapping[str, str]] = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("NVSHIM_CONFIG") or DEFAULT_CONFIG_PATH


def config_named(environ: Optional[Mapping[str, str]] = None) -> str:
    """Who named the config a create must find (``NVSHIM_CONFIG``, the installed
    ``nvshim-runtime``); "" when it is only the default path looked for, where a missing
    file means the built-in defaults (podman or runc without any config)."""
    env = os.environ if environ is None else environ
    if env.get("NVSHIM_CONFIG"):
        return "NVSHIM_CONFIG"
    return "the installed nvshim-runtime" if DEFAULT_CONFIG_NAMED else ""


def describe_config(config: Config) -> str:
    """Which configuration a create used, for error lines: ``config <file>``, or the
    built-in defaults and the file that was looked for (podman, for one, does not pass
    ``NVSHIM_CONFIG`` on to the runtime)."""
    if config.source:
        return f"config {config.source}"
    return f"built-in defaults: no config {config_path()}"


def _compiled(path: str, suffix: str) -> str:
    stem = path[: -len(".yaml")] if path.endswith(".yaml") else path
    return stem + suffix


def compiled_path(path: str) -> str:
    """Where ``nvshim config compile`` keeps the validated copy of ``path``."""
    return _compiled(path, ".compiled.json")


def plan_path(path: str) -> str:
    """The node plan cache (:mod:`nvshim.runtime.plancache`) kept next to the compiled config."""
    return _compiled(path, ".plan.json")


def cdi_index_path(path: str) -> str:
    """The index of the CDI spec dirs (:mod:`nvshim.cdi.index`) kept next to the compiled config."""
    return _compiled(path, ".cdi-index.json")


def runtimes_path(path: str) -> str:
    """The runtime list for the sh trampoline (one per line), written by compile."""
    return _compiled(path, ".runtimes")


def prefixes_path(path: str) -> str:
    """The annotation prefixes the sh trampoline greps for (one per line), written by compile."""
    return _compiled(path, ".annotation-prefixes")


def default_mark_path(path: str) -> str:
    """The mark that a default runtime reads ``path`` (:mod:`nvshim.node.configguard`)."""
    return _compiled(path, ".default-runtime")


def source_link_path(path: str) -> str:
    """A hard link to the YAML that was compiled, written by compile.

    The trampoline cannot parse or hash the YAML; ``[ yaml -ef link ]`` (same inode) plus
    "the lists carry the YAML's exact mtime" tells it, without forking, that the YAML is
    the one compiled and was not written since — whatever the order of mtimes (``cp -p``,
    ``rsync -t`` and ``tar x`` install a file with an *older* mtime).
    """
    return _compiled(path, ".source-link")


def compiled_lists_fresh(path: str) -> bool:
    """What the trampoline checks: the lists were compiled from this very YAML file."""
    try:
        yaml_st = os.stat(path)
        if not os.path.samestat(yaml_st, os.stat(source_link_path(path))):
            return False
        return all(
            os.stat(p).st_mtime_ns == yaml_st.st_mtime_ns
            for p in (runtimes_path(path), prefixes_path(path))
        )
    except OSError:
        return False


def compiled_matches(doc: Any, data: bytes) -> bool:
    """Whether a compiled document was made from exactly these YAML bytes (and this nvshim).

    The YAML text itself is stored and compared: cheaper than hashing (hashlib is a costly
    import on the create path: BENCHMARKS.md, figures) and just as exact.
    """
    return (
        isinstance(doc, dict)
        and doc.get("nvshim-version") == __version__
        and doc.get("source-text") == data.decode("utf-8", errors="surrogateescape")
    )


def _check_lists(path: str) -> None:
    """The trampoline's lists (Python does not read them) must be as trusted as the YAML."""
    for listing in (runtimes_path(path), prefixes_path(path)):
        try:
            st = os.stat(listing)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot stat config {listing}: {exc.strerror}") from exc
        check_trusted(listing, st)


def _from_compiled(path: str, data: bytes) -> Optional[Config]:
    """The compiled copy of ``path`` when it matches ``data`` exactly, else None."""
    raw = read_bytes(compiled_path(path))
    if raw is None:
        return None
    from nvshim._jsonc import loads

    try:
        doc = loads(raw)
    except ValueError:
        return None
    if not compiled_matches(doc, data):
        return None
    values = doc.get("config")
    if not isinstance(values, dict):
        return None
    try:
        return Config.from_mapping(values, path)
    except TypeError:  # written by an nvshim with other keys (an upgrade under way): stale
        return None


def parse_config_text(data: bytes, path: str) -> Config:
    """Checked path: YAML → mapping → jsonschema → :class:`Config`
    (:func:`nvshim.configcheck.checked_mapping`: every problem in one ConfigError)."""
    from nvshim.configcheck import checked_mapping  # yaml and jsonschema: only here

    return Config.from_mapping(checked_mapping(data, path), path)


def load_config(path: Optional[str] = None, required: bool = False) -> Config:
    """Load the configuration; defaults when the file does not exist, unless ``required``
    (a file named explicitly, e.g. ``--config``, must exist)."""
    path = path or config_path()
    data = read_bytes(path)
    if data is None:
        if required:
            raise ConfigError(f"config {path} does not exist")
        return Config()
    _check_lists(path)
    compiled = _from_compiled(path, data)
    if compiled is not None:
        return compiled
    return parse_config_text(data, path)
