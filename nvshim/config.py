"""nvshim's own configuration: ``/etc/nvshim/config.yaml`` (or ``$NVSHIM_CONFIG``).

Two ways in, one result:

* the checked path parses the YAML and validates it against ``config/nvshim.schema.json``
  with jsonschema; every unknown key and bad value is found in one pass and reported in
  one line naming the file, each key and what is allowed (with the key or value a near
  miss probably meant);
* the hot path reads ``<stem>.compiled.json`` next to the YAML, written by
  ``nvshim config compile``; it holds the validated values and the YAML text it came
  from, so an edited YAML is noticed and the checked path is taken instead.

A missing file means defaults, except to a create whose config was named
(:func:`config_named`): that fails. The runtime never writes the compiled file itself; the
only file a create may write next to it is the node plan cache (:mod:`nvshim.runtime.plancache`).
"""

from __future__ import annotations

import os
import stat

from nvshim import __version__
from nvshim._record import dataclass, fields
from nvshim.errors import ConfigError

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Dict, List, Mapping, Optional, Tuple

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
    "compiled_lists_fresh",
    "cdi_index_path",
    "check_trusted",
    "load_config",
    "parse_config_text",
    "describe_problems",
    "expanded_size",
    "read_bytes",
    "compiled_matches",
    "ALL_CAPABILITIES",
    "DEFAULT_CAPABILITIES",
    "DEFAULT_CDI_SPEC_DIRS",
]

DEFAULT_CONFIG_PATH = "/etc/nvshim/config.yaml"

#: Every driver capability (NVIDIA_DRIVER_CAPABILITIES), sorted: the one list of them. The
#: config schema's enum and discovery's per-capability tables are kept equal to it by
#: tests/unit/test_capabilities.py.
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
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
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
    supported_driver_capabilities: Tuple[str, ...] = ALL_CAPABILITIES
    disable_require: bool = False
    disable_device_node_modification: bool = True
    source: Optional[str] = None
    """The file these values came from (None = built-in defaults)."""

    @property
    def effective_dev_root(self) -> str:
        return self.dev_root or self.driver_root

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
        return all(os.stat(p).st_mtime_ns == yaml_st.st_mtime_ns
                   for p in (runtimes_path(path), prefixes_path(path)))
    except OSError:
        return False


def compiled_matches(doc: Any, data: bytes) -> bool:
    """Whether a compiled document was made from exactly these YAML bytes (and this nvshim).

    The YAML text itself is stored and compared: cheaper than hashing (hashlib is ~5 ms to
    import on the create path) and just as exact.
    """
    return (
        isinstance(doc, dict)
        and doc.get("nvshim-version") == __version__
        and doc.get("source-text") == data.decode("utf-8", errors="surrogateescape")
    )


def check_trusted(path: str, st: os.stat_result, what: str = "config") -> None:
    """Refuse a config file others could have written (like sshd's StrictModes, sudo).

    nvshim-runtime runs as root and executes the runtimes these files name, so when
    running as root each file nvshim reads or the trampoline trusts must be owned by root
    and writable by its owner only, and no directory its lookup goes through (ancestors,
    and past a symlink its target's) may let others replace it (:mod:`nvshim._trust`).
    ``what`` names the kind of file in the message: the same rule holds CDI spec files,
    whose hooks run as root on the host (:mod:`nvshim.cdi.load`).
    """
    euid = os.geteuid()
    if euid != 0:
        return  # the rule protects root; a user's own nvshim reads what that user may read
    if st.st_uid != 0:
        raise ConfigError(
            f"{what} {path} is owned by uid {st.st_uid}, not root: nvshim-runtime runs as "
            f"root and executes what it names; run chown root {path}"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"{what} {path} is writable by group or others (mode {st.st_mode & 0o7777:04o}): "
            f"nvshim-runtime runs as root and executes what it names; run chmod go-w {path}"
        )
    from nvshim._trust import lookup_problem

    problem = lookup_problem(path, what)  # the ancestors, and past a symlink its target's
    if problem:
        raise ConfigError(problem)


def read_trusted_cache(path: str, what: str) -> Tuple[Optional[Any], str]:
    """(the parsed JSON, "") of a cache nvshim keeps beside the config (node plan, CDI
    index), else (None, why not): missing, unreadable, not trusted like the config (a cache
    names host files and hooks that go into containers), or not JSON. Never raises: a
    cache that cannot be used is rebuilt, it never fails a create."""
    from nvshim._jsonc import loads

    try:
        with _open_file(path) as fh:
            try:
                check_trusted(path, os.fstat(fh.fileno()))
            except ConfigError as exc:
                return None, f"{what} not trusted: {exc}"
            raw = fh.read()
    except _NotAFile:
        return None, f"{what} is not a regular file"
    except FileNotFoundError:
        return None, f"no {what}"
    except OSError as exc:
        return None, f"{what} unreadable: {exc.strerror}"
    try:
        return loads(raw), ""
    except (ValueError, RecursionError):
        return None, f"{what} is not valid JSON"


class _NotAFile(Exception):
    """Internal: the path is a FIFO, a device, a socket or a directory."""


def _open_file(path: str) -> BinaryIO:
    """``open(path, "rb")`` that refuses anything but a regular file, without blocking: a
    FIFO at a config path would otherwise hang every create waiting for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _NotAFile(path)
    return open(fd, "rb")


def read_bytes(path: str) -> Optional[bytes]:
    try:
        with _open_file(path) as fh:
            check_trusted(path, os.fstat(fh.fileno()))
            return fh.read()
    except _NotAFile:
        raise ConfigError(f"cannot read config {path}: not a regular file") from None
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc


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
    return Config.from_mapping(values, path)


def _schema() -> Dict[str, Any]:
    import json

    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (
        os.path.join(here, "data", "config-schema.json"),
        os.path.join(os.path.dirname(here), "config", "nvshim.schema.json"),
    ):
        if os.path.exists(candidate):
            with open(candidate, encoding="utf-8") as fh:
                loaded: Dict[str, Any] = json.load(fh)
                return loaded
    raise ConfigError("config schema is missing from the nvshim installation")


#: More values than any nvshim config holds (the shipped one has about 40).
_MAX_VALUES = 100_000


def expanded_size(value: Any, limit: int) -> int:
    """How many values a decoded YAML document holds once its aliases are expanded,
    counted up to just past ``limit``.

    YAML aliases make two places of a document one Python object, so a few hundred bytes
    of nested ``&anchor``/``*alias`` pairs (a "billion laughs") decode in microseconds into
    a tree of billions of values, and whatever then walks the tree (a schema validator,
    an error message quoting a value) never finishes. Each distinct list or mapping is
    visited once here, so counting costs what the document's text does. A collection
    that holds itself (``&a [*a]``) is endless, so counts as more than ``limit``.
    """
    return _size(value, limit, {})


def _size(value: Any, limit: int, seen: Dict[int, int]) -> int:
    if not isinstance(value, (list, dict)):
        return 1
    known = seen.get(id(value))
    if known is not None:
        return known
    seen[id(value)] = limit + 1  # met again inside itself: a YAML alias to its own anchor
    total = 1
    for item in value.values() if isinstance(value, dict) else value:
        total += _size(item, limit, seen)
        if total > limit:
            break
    seen[id(value)] = total
    return total


def _quote(value: Any, limit: int = 120) -> str:
    """A value as a message shows it: JSON where it is JSON, cut to ``limit`` characters
    (one long value must not push the other problems out of a message)."""
    import json

    try:
        text = json.dumps(value)
    except TypeError:  # YAML has dates, sets and binary values that JSON has not
        text = (str(value) if isinstance(value, (list, dict, set))
                else f"{value} (a {type(value).__name__})")
    return text if len(text) <= limit else text[:limit] + "…"


def _describe_allowed(schema: Mapping[str, Any], plural: bool = False) -> str:
    """What ``schema`` accepts, in words: ``an absolute path or null``, ``one of "a", "b"``
    (``plural``: what each item of a list must be)."""
    import json

    if "enum" in schema:
        values = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"values from {values}" if plural else f"one of {values}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    words = [_describe_type(k, schema, plural) for k in kinds]
    return " or ".join(words) if words else ("valid values" if plural else "a valid value")


#: How the schema's patterns read in a message (one, several).
_PATTERN_WORDS = {
    "^/": ("an absolute path", "absolute paths"),
    "^[^\\s]+$": ("a string without spaces", "strings without spaces"),
}


def _describe_type(kind: str, schema: Mapping[str, Any], plural: bool) -> str:
    def noun(one: str, many: str) -> str:
        return many if plural else one

    if kind == "null":
        return "null"
    if kind == "string":
        pattern = schema.get("pattern")
        if pattern in _PATTERN_WORDS:
            return noun(*_PATTERN_WORDS[pattern])
        if pattern:
            return noun(f"a string matching {pattern}", f"strings matching {pattern}")
        if schema.get("minLength"):
            return noun("a non-empty string", "non-empty strings")
        return noun("a string", "strings")
    if kind in ("integer", "number"):
        text = noun("an integer", "integers") if kind == "integer" else noun("a number", "numbers")
        bounds = [f"{word} {schema[limit]}" for limit, word in (
            ("exclusiveMinimum", "above"), ("minimum", "at least"),
            ("exclusiveMaximum", "below"), ("maximum", "at most")) if limit in schema]
        return ", ".join([text, " and ".join(bounds)]) if bounds else text
    if kind == "array":
        items = schema.get("items")
        text = noun("a list", "lists") + " of " + (
            _describe_allowed(items, plural=True) if items else "values")
        least = schema.get("minItems", 0)
        if least:
            text += " (at least one)" if least == 1 else f" (at least {least})"
        return text
    if kind == "object":
        return noun("a mapping", "mappings")
    return noun(f"a {kind}", f"{kind}s")


def _did_you_mean(word: Any, choices: Any) -> str:
    """`` (did you mean "x"?)`` when ``word`` is a near miss of one of ``choices``, else ""."""
    import difflib

    if not isinstance(word, str):
        return ""
    strings = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(word, strings, n=1) or difflib.get_close_matches(
        word.lower(), strings, n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


def _unique_key_loader(yaml: Any, duplicates: List[str]) -> Any:
    """yaml's SafeLoader, noting in ``duplicates`` each key given twice in one mapping.

    ``require-allocation: true`` followed later by ``require-allocation: false`` is a
    mistake either way; silently keeping one of them (what YAML does) hides it.
    """

    class UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: Dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader reports it itself
                    continue
                if first is not None:
                    duplicates.append(
                        f'line {line}: duplicate key "{key}" (first on line {first})')
                else:
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _load_yaml(data: bytes, path: str, duplicates: List[str]) -> Dict[Any, Any]:
    """The YAML's top-level mapping; a file YAML cannot read at all is one ConfigError."""
    import yaml

    try:
        doc = yaml.load(data, Loader=_unique_key_loader(yaml, duplicates)) if data.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config {path}:{where} {problem}") from exc
    except RecursionError as exc:  # yaml composes nested collections recursively
        raise ConfigError(f"config {path}: invalid YAML: nested too deeply") from exc
    except ValueError as exc:
        # a scalar yaml cannot convert: a date like 2024-13-45, an integer over Python's
        # digit limit
        raise ConfigError(f"config {path}: invalid YAML: {exc}") from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(
            f"config {path}: top level must be a mapping of keys, got {type(doc).__name__}")
    if expanded_size(doc, _MAX_VALUES) > _MAX_VALUES:
        # YAML aliases share one object, so a few hundred bytes can stand for billions of
        # values: validating or printing them would never end
        raise ConfigError(f"config {path}: more than {_MAX_VALUES} values once YAML aliases "
                          "are expanded")
    return doc


def _key_problems(doc: Mapping[Any, Any]) -> List[str]:
    """Everything wrong with the keys and values of ``doc``, in the document's order: each
    unknown key (with the key it may have meant) and each value the schema refuses (with
    what it allows)."""
    import jsonschema

    schema = _schema()
    props: Mapping[str, Any] = schema["properties"]
    known = {key: value for key, value in doc.items() if key in props}
    by_key: Dict[str, List[Any]] = {}
    for err in jsonschema.Draft202012Validator(schema).iter_errors(known):
        parts = list(err.absolute_path)
        by_key.setdefault(str(parts[0]) if parts else "", []).append(err)
    problems: List[str] = []
    listed_allowed = False
    for key in [*doc, *(k for k in by_key if k not in doc)]:
        if key not in props and key != "":
            hint = _did_you_mean(str(key), props)
            if not hint and not listed_allowed:  # the whole list once is enough
                hint = f" (allowed: {', '.join(sorted(props))})"
                listed_allowed = True
            problems.append(f'unknown key "{key}"{hint}')
            continue
        for err in sorted(by_key.get(key, []), key=lambda e: list(e.absolute_path)[1:]):
            problems.append(_value_problem(err, props))
    return problems


def _value_problem(err: Any, props: Mapping[str, Any]) -> str:
    """One jsonschema error as ``"key[i]" is VALUE, must be WHAT``."""
    parts = list(err.absolute_path)
    key = str(parts[0]) if parts else "?"
    sub = "".join(f"[{p}]" for p in parts[1:])
    key_schema: Mapping[str, Any] = props.get(key, {})
    target = key_schema.get("items", key_schema) if sub else key_schema
    if err.validator == "uniqueItems":
        allowed = "a list without duplicates"
    else:
        allowed = _describe_allowed(target)
    hint = _did_you_mean(err.instance, target["enum"]) if err.validator == "enum" else ""
    return f'"{key}{sub}" is {_quote(err.instance)}, must be {allowed}{hint}'


def describe_problems(path: str, problems: List[str]) -> str:
    """One line for any number of problems: ``config PATH: P`` or
    ``config PATH: N problems: P1; P2`` (a terminal and containerd's log show one line)."""
    if len(problems) == 1:
        return f"config {path}: {problems[0]}"
    return f"config {path}: {len(problems)} problems: " + "; ".join(problems)


def parse_config_text(data: bytes, path: str) -> Config:
    """Checked path: YAML → mapping → jsonschema → :class:`Config`.

    Every problem is found in one pass (keys given twice, unknown keys, values of the wrong
    type or out of range) and reported in one ConfigError.
    """
    duplicates: List[str] = []
    doc = _load_yaml(data, path, duplicates)
    problems = duplicates + _key_problems(doc)
    if problems:
        raise ConfigError(describe_problems(path, problems))
    return Config.from_mapping(doc, path)


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
