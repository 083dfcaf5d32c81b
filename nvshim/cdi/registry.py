"""The CDI registry: scan spec directories with CDI's priority and conflict rules, and
resolve requested ``vendor/class=device`` names into one :class:`~nvshim.edits.Edits`.

:func:`spec_files` lists a directory's spec files (the rule every scan uses: the
registry, the index, ``nvshim doctor``); :func:`build_registry` applies CDI's rules to
specs already loaded (a full scan, :func:`load_registry`, or the index's selection);
:func:`resolve_devices` merges the edits of the requested names;
:func:`refuse_unapplied` refuses names whose edits set a field nvshim cannot apply, and
:func:`fill_device_nodes` gives device nodes their host node's type and numbers (the
steps of a create's :func:`nvshim.runtime.cdiedits.inject_cdi`).
"""

from __future__ import annotations

import os

from nvshim.cdi.load import UntrustedProblem, load_spec_file
from nvshim.cdi.model import SPEC_EXTENSIONS, Registry, ResolvedDevice
from nvshim.cdi.names import qualified_name
from nvshim.config import DEFAULT_CDI_SPEC_DIRS
from nvshim.edits import Edits
from nvshim.errors import CdiError, CdiProblem, CdiSpecError, HostError, RequestError

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Dict, Iterable, List, Optional, Sequence, Tuple

    from nvshim.cdi.model import Spec
    from nvshim.host.discovery import Host

__all__ = [
    "spec_files",
    "load_registry",
    "build_registry",
    "resolve_devices",
    "refuse_unapplied",
    "fill_device_nodes",
]


def spec_files(directory: str, problems: List[CdiProblem]) -> List[str]:
    """The spec files of ``directory``, in name order: entries ending in .json or .yaml
    that are not directories (a symlink counts as what its name says; not followed for the
    directory test). A missing directory has none; one that is not a directory or cannot
    be listed adds a problem to ``problems`` and has none. Not recursive.
    """
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        problems.append(CdiProblem(directory, "$", "spec directory is not a directory"))
        return []
    except OSError as exc:
        problems.append(CdiProblem(directory, "$", f"cannot list spec directory: {exc.strerror}"))
        return []
    files = []
    for entry in entries:
        if not entry.name.endswith(SPEC_EXTENSIONS):
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if not is_dir:
            files.append(entry.path)
    return files


def load_registry(spec_dirs: Sequence[str] = DEFAULT_CDI_SPEC_DIRS) -> Registry:
    """Load every spec of ``spec_dirs`` with CDI's rules.

    Directories are scanned in order, non-recursively, files in name order; a later
    directory has higher priority and silently overrides. A file that fails to load is
    skipped and recorded in ``problems``, and so is a file others could have written (the
    config files' trust rule, :func:`nvshim.cdi.load.load_spec_file`). A device defined in
    two files of the same directory is a conflict: recorded, and the device is dropped
    entirely.
    """
    return build_registry(spec_dirs, _scan_specs(spec_dirs))


def _scan_specs(spec_dirs: Sequence[str]) -> Iterable[Tuple[int, Optional[Spec], List[CdiProblem]]]:
    """(rank, spec or None, problems) for every spec file of ``spec_dirs``, in CDI order."""
    for rank, directory in enumerate(spec_dirs):
        problems: List[CdiProblem] = []
        files = spec_files(directory, problems)
        if problems:
            yield rank, None, problems
        for path in files:
            try:
                yield rank, load_spec_file(path, check_trust=True), []
            except CdiSpecError as exc:
                yield rank, None, exc.problems


def build_registry(
    spec_dirs: Sequence[str], loaded: Iterable[Tuple[int, Optional[Spec], List[CdiProblem]]]
) -> Registry:
    """A :class:`Registry` from specs already loaded, in scan order (CDI's priority and
    conflict rules; shared by :func:`load_registry` and the spec index)."""
    registry = Registry(spec_dirs=tuple(spec_dirs))
    priority: Dict[str, int] = {}
    conflicted: set[str] = set()
    for rank, spec, problems in loaded:
        registry.problems.extend(problems)
        for problem in problems:
            if isinstance(problem, UntrustedProblem):
                for name in problem.devices:
                    registry.untrusted.setdefault(name, problem)
        if spec is None:
            continue
        path = spec.path
        registry.specs.append(spec)
        for index, device in enumerate(spec.devices):
            name = qualified_name(spec.kind, device.name)
            old = registry.devices.get(name)
            if old is not None and priority[name] == rank:
                registry.problems.append(
                    CdiProblem(
                        path,
                        f"$.devices[{index}].name",
                        f'conflicting device "{name}" (specs "{old.spec.path}", "{path}"):'
                        " device dropped",
                    )
                )
                conflicted.add(name)
                continue
            registry.devices[name] = ResolvedDevice(spec, device)
            priority[name] = rank
    for name in conflicted:
        registry.devices.pop(name, None)
    return registry


def resolve_devices(registry: Registry, names: Sequence[str]) -> Edits:
    """The merged edits for ``names``, in CDI order.

    Names are taken in order (repeats collapsed); the first time a spec is met its
    spec-level edits are added, then each device's own. If any name is unknown nothing
    is resolved: raises :class:`CdiError` listing all of them and the directories searched,
    or, for a name only an untrusted spec file declares, naming that file and the rule.
    """
    unique = list(dict.fromkeys(names))
    missing = [name for name in unique if name not in registry.devices]
    for name in missing:
        untrusted = registry.untrusted.get(name)
        if untrusted is not None:
            raise CdiError(
                f"CDI device {name} is defined only by CDI spec {untrusted.path}, "
                f"which nvshim does not trust and skips: {untrusted.message}"
            )
    if missing:
        searched = ", ".join(registry.spec_dirs) or "no spec directories"
        hint = ""
        if registry.problems:
            count = len(registry.problems)
            plural = "s" if count != 1 else ""
            hint = f"; {count} spec problem{plural}, first: {registry.problems[0]}"
        raise CdiError(f"unresolvable CDI devices {', '.join(missing)} (searched {searched}{hint})")
    edits = Edits()
    seen_specs: set[str] = set()
    for name in unique:
        resolved = registry.devices[name]
        if resolved.spec.path not in seen_specs:
            seen_specs.add(resolved.spec.path)
            edits = edits + resolved.spec.edits
        edits = edits + resolved.device.edits
    return edits


def refuse_unapplied(registry: Registry, names: Sequence[str]) -> None:
    """CdiError when the edits ``names`` inject (their specs' and their own) set a
    ``containerEdits`` field nvshim cannot apply (:data:`~nvshim.cdi.model.UNAPPLIED_EDITS`):
    the container would run without what its spec gives it. Names the registry lacks are
    skipped (:func:`resolve_devices` reports them)."""
    for name in dict.fromkeys(names):
        resolved = registry.devices.get(name)
        if resolved is None:
            continue
        for fields, where in (
            (resolved.spec.unapplied, "its spec's containerEdits"),
            (resolved.device.unapplied, "its containerEdits"),
        ):
            if fields:
                raise CdiError(
                    f"CDI device {name}: {where} set {' and '.join(fields)} "
                    f"({resolved.spec.path}), which nvshim-runtime cannot apply (it applies "
                    "env, deviceNodes, mounts, hooks and additionalGids): let the engine "
                    "inject CDI devices (containerd 1.7+ enable_cdi, CRI-O, podman --device) "
                    "or drop the field from the spec"
                )


def fill_device_nodes(edits: Edits, host: Host) -> Edits:
    """``edits`` whose device nodes without type or major get them, and their file mode
    when unset, from the host node their ``hostPath`` names (as CDI does), stat'ed through
    ``host``: CDI host paths are absolute, so ``host`` is one of the machine's ``/``.

    A host node that does not exist is a :class:`HostError`; one of another type than the
    spec says, a :class:`RequestError`.
    """
    from nvshim._record import replace

    nodes = []
    for node in edits.device_nodes:
        if node.type is not None and (node.major is not None or node.type == "p"):
            nodes.append(node)
            continue
        stat_node = host.device_node(node.source)
        if stat_node is None:
            raise HostError(f'CDI device node host path "{node.source}" does not exist')
        if node.type is not None and node.type != stat_node.type:
            raise RequestError(
                f'CDI device node {node.path}: type "{node.type}" does not match the host '
                f'node {node.source} ("{stat_node.type}")'
            )
        nodes.append(
            replace(
                node,
                type=stat_node.type,
                major=stat_node.major,
                minor=stat_node.minor,
                file_mode=node.file_mode if node.file_mode is not None else stat_node.file_mode,
            )
        )
    return replace(edits, device_nodes=tuple(nodes))
