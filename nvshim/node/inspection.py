"""What ``nvshim inspect`` shows of a create plan: a summary, its text form and the diff.

Reads a :class:`~nvshim.runtime.plan.Plan` (what create would do to a bundle) and the
config it was made with; writes nothing. Not on the create path: only the ``nvshim``
command imports it. (Not named ``inspect``: that would shadow the standard library's
module for anything run with this directory on ``sys.path``.)

Why one module: the summary, the text form and the diff all read the same plan with the same
words, and `nvshim inspect` is their one caller; apart, the three would have to agree on
those words across files.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple  # Any: JSON values

if TYPE_CHECKING:
    from nvshim.config import Config
    from nvshim.edits import Hook
    from nvshim.host.devices import MigDevice
    from nvshim.host.discovery import Gpu
    from nvshim.runtime.plan import Plan

__all__ = [
    "env_set",
    "plan_summary",
    "plan_diff",
    "hook_line",
    "render_summary",
    "render_details",
    "render_text",
    "rewritten_mark",
    "live_summary",
    "render_live",
]


def _env(spec: object) -> List[str]:
    process = spec.get("process") if isinstance(spec, dict) else None
    entries = process.get("env") if isinstance(process, dict) else None
    return [e for e in entries if isinstance(e, str)] if isinstance(entries, list) else []


def env_set(plan: Plan) -> List[str]:
    """The env entries the rewrite adds or changes (NVIDIA_VISIBLE_DEVICES=void after an
    injection or a stripped request), as the container will see them."""
    if not plan.changed:
        return []
    before = set(_env(plan.spec))
    return [e for e in _env(plan.new_spec) if e not in before]


def _gpus_json(gpus: Sequence[Gpu]) -> List[Dict[str, Any]]:
    return [
        {"index": g.index, "minor": g.minor, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id}
        for g in gpus
    ]


def _migs_json(migs: Sequence[Tuple[Gpu, MigDevice]]) -> List[Dict[str, Any]]:
    return [{"device": f"{p.index}:{m.index}", "uuid": m.uuid} for p, m in migs]


def plan_summary(plan: Plan, config: Config) -> Dict[str, Any]:
    """The plan as plain JSON values: the request, what was granted, the edits, who does the
    in-root work, where the node plan and CDI registry came from."""
    from nvshim.host.devices import describe_indices

    req = plan.request
    env = env_set(plan)
    summary: Dict[str, Any] = {
        "bundle_config": plan.spec_path,
        "config_file": config.source,
        "require_allocation": config.require_allocation,
        "source": req.source,
        "requested": list(req.devices),
        "driver_files": req.driver_files,
        "capabilities": list(req.capabilities) if req.injects else [],
        "granted_gpus": _gpus_json(plan.gpus),
        "granted_mig": _migs_json(plan.migs),
        "cdi_devices": list(plan.cdi_names),
        # what the engine injected before nvshim ran (CDI, DRA): the container holds it
        "engine_gpus": _gpus_json(plan.engine_gpus),
        "engine_mig": _migs_json(plan.engine_migs),
        "engine_imex_channels": list(plan.engine_imex),
        "engine_hooks_replaced": [hook_line(h) for h in _replaced(plan)],
        # a MIG device brings its parent GPU's node: one node, listed once
        "device_nodes": sorted({n.path for n in plan.edits.device_nodes}),
        "notes": list(plan.notes),
        "warnings": list(dict.fromkeys(plan.warnings)),
        "missing_files": list(plan.grant.missing),
        "env_set": env,
        "edits": plan.applied_edits().to_cdi(),
        "rootfs_work": {"by": plan.rootfs.by or None, "detail": plan.rootfs.why or None},
        "node_plan": plan.plan_source or None,
        "cdi_registry": plan.cdi_source or None,
        "changes_config": plan.changed,
        "container": str(plan.identity) if plan.identity else None,
        "verified": plan.verified,
        "kubelet_allocation": list(plan.allocation.ids) if plan.allocation else None,
        "kubelet_claims": [
            {
                "claim": str(c),
                "devices": [
                    {
                        "driver": d.driver,
                        "pool": d.pool,
                        "device": d.device,
                        "cdi_devices": list(d.cdi_devices),
                    }
                    for d in c.devices
                ],
            }
            for c in plan.allocation.claims
        ]
        if plan.allocation
        else None,
    }
    summary["granted_indices"] = describe_indices([g.index for g in plan.gpus])
    summary["set_void"] = "NVIDIA_VISIBLE_DEVICES=void" in env
    return summary


def plan_diff(plan: Plan) -> str:
    """A unified diff of config.json before and after; empty when nothing changes."""
    if not plan.changed:
        return ""
    from nvshim.runtime.specjson import dumps

    before = dumps(plan.spec, plan.original, indent=2, sort_keys=True).splitlines(keepends=True)
    after = dumps(plan.new_spec, plan.original, indent=2, sort_keys=True).splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, "config.json", "config.json (after nvshim)"))


def _replaced(plan: Plan) -> List[Hook]:
    """The engine's hooks dropped from config.json (their binary is not on this node;
    nvshim does their work)."""
    from nvshim.edits import Hook

    found = plan.grant.engine_hooks.replaced if plan.grant.engine_hooks is not None else ()
    return [
        Hook(name, str(h.get("path")), tuple(str(a) for a in h.get("args") or ()))
        for name, h in found
    ]


def _plural(n: int, word: str, words: str = "") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def _arg(arg: str) -> str:
    """One hook argument as a shell would read it; a script (a multi-line argument) as
    ``<script, N lines>`` instead of its body."""
    import shlex

    if "\n" in arg:
        return f"<script, {arg.count(chr(10)) + 1} lines>"
    return shlex.quote(arg)


def hook_line(hook: Hook) -> str:
    """A hook in one line: ``createContainer: PATH ARGS…`` with scripts elided; for nvshim's
    own hook, what it does (SONAME links, ld.so.cache folders) instead of its long argv."""
    from nvshim.runtime.hookargs import (
        is_nvshim_hook,
        parse_graphics_args,
        parse_hook_args,
        parse_host_driver_version,
    )

    if is_nvshim_hook(hook):
        links, folders = parse_hook_args(hook.args)
        what = f"{_plural(len(links), 'SONAME link')}, ld.so.cache of {', '.join(folders) or '-'}"
        version = parse_host_driver_version(hook.args)
        if version:
            what += f", CUDA compat check against driver {version}"
        dev_links, egl = parse_graphics_args(hook.args)
        if dev_links:
            what += f", {_plural(len(dev_links), '/dev/dri/by-path link')}"
        if egl:
            what += ", EGL application profile"
        return f"{hook.hook_name}: nvshim hook ({hook.path}): {what}"
    return " ".join([f"{hook.hook_name}: {hook.path}", *(_arg(a) for a in hook.args[1:])])


def _rootwork_line(plan: Plan) -> str:
    if plan.rootfs.by == "runtime":
        return f"by nvshim-runtime before runc, in {plan.rootfs.why}"
    if plan.rootfs.by == "nobody":
        return f"none ({plan.rootfs.why})"
    return f"by the createContainer hook ({plan.rootfs.why})"


def render_summary(plan: Plan, config: Config) -> List[str]:
    """What an operator asks first, one screen for a node's worth of GPUs: where the request
    came from, what was granted (index and UUID), the capabilities, how many edits, who makes
    the SONAME links, where the node plan came from, warnings and notes."""
    summary = plan_summary(plan, config)
    request = plan.request
    out: List[str] = []
    out.append(f"bundle:        {plan.spec_path}")
    out.append(
        f"config:        {config.source or '(defaults)'}"
        f"{' [require-allocation]' if config.require_allocation else ''}"
    )
    if plan.identity is not None:
        out.append(f"container:     {plan.identity}")
    out.append(f"request from:  {summary['source']}")
    if plan.allocation is not None:
        listed = list(plan.allocation.ids) + [
            f"DRA claim {c} ({', '.join(c.cdi_devices) or 'no CDI device'})"
            for c in plan.allocation.claims
        ]
        out.append(
            f"verified:      kubelet ({plan.allocation.via}): allocated "
            f"{', '.join(listed) or 'no GPU'}"
        )
    elif plan.verified == "unreachable":
        out.append("verified:      no: the kubelet was unreachable, claims trusted")
    elif plan.verified == "unidentified":
        out.append("verified:      no: not a CRI container, claims judged by allocation-sources")
    files_only = "  (driver files only)" if request.driver_files and not request.devices else ""
    out.append(f"requested:     {', '.join(summary['requested']) or '-'}{files_only}")
    for label, rows in (
        ("granted GPUs:", [f"{g.index}  {g.uuid}" for g in plan.gpus]),
        ("granted MIG:", [f"{p.index}:{m.index}  {m.uuid}" for p, m in plan.migs]),
        ("engine GPUs:", [f"{g.index}  {g.uuid}" for g in plan.engine_gpus]),
        ("engine MIG:", [f"{p.index}:{m.index}  {m.uuid}" for p, m in plan.engine_migs]),
    ):
        # the label on the first row only
        out.extend(f"{label if i == 0 else '':<15}{row}" for i, row in enumerate(rows))
    if plan.engine_imex:
        out.append(f"engine IMEX:   {', '.join(map(str, plan.engine_imex))}")
    if plan.cdi_names:
        out.append(f"CDI devices:   {', '.join(plan.cdi_names)}")
    if request.injects:
        out.append(f"capabilities:  {', '.join(summary['capabilities'])}")
    edits = plan.applied_edits()
    if plan.changed:
        counts = [
            _plural(len(summary["device_nodes"]), "device node"),
            _plural(len(edits.mounts), "mount"),
            _plural(len(edits.hooks), "hook"),
            _plural(len(summary["env_set"]), "env entry", "env entries"),
        ]
        if summary["engine_hooks_replaced"]:
            counts.append(f"{len(summary['engine_hooks_replaced'])} of the engine's hooks replaced")
        out.append(f"edits:         {', '.join(counts)}")
    if plan.rootfs.by:
        out.append(f"in-root work:  {_rootwork_line(plan)}")
    if plan.plan_source:
        out.append(f"node plan:     {plan.plan_source}")
    if plan.cdi_source:
        out.append(f"CDI registry:  {plan.cdi_source}")
    if plan.grant.missing:
        out.append(
            f"missing:       {', '.join(plan.grant.missing)}: expected for the requested "
            "capabilities, not found under the driver root"
        )
    out.extend(f"warning:       {w}" for w in summary["warnings"])
    out.extend(f"note:          {n}" for n in plan.notes if n not in summary["warnings"])
    rewrite = "would be rewritten" if plan.changed else "unchanged (byte-identical)"
    out.append(f"config.json:   {rewrite}")
    return out


def render_details(plan: Plan) -> List[str]:
    """The edits one by one: each granted GPU's node, bus id and model, the device nodes,
    the mounts, one line per hook (no script bodies) and the env entries set."""
    request = plan.request
    edits = plan.applied_edits()
    out: List[str] = []
    for g in plan.gpus:
        out.append(
            f"{'GPU ' + str(g.index) + ':':<15}/dev/nvidia{g.minor}  {g.pci_bus_id}  "
            f"{g.model}".rstrip()
        )
    nodes = sorted({n.path for n in plan.edits.device_nodes})
    if nodes:
        out.append(f"device nodes:  {' '.join(nodes)}")
    if edits.mounts:
        out.append(f"mounts:        {_plural(len(edits.mounts), 'driver file')}")
        out.extend(f"  {m.container_path}" for m in edits.mounts)
    out.extend(f"hook:          {hook_line(h)}" for h in edits.hooks)
    out.extend(f"replaced:      {hook_line(h)} (not on this node)" for h in _replaced(plan))
    for entry in env_set(plan):
        why = ""
        if entry == "NVIDIA_VISIBLE_DEVICES=void":
            why = (
                " (image value stripped)"
                if request.set_void
                else " (after injection, so nothing downstream injects again)"
            )
        out.append(f"env:           {entry}{why}")
    return out


def render_text(plan: Plan, config: Config) -> str:
    """The summary, a blank line and the details (no diff, no trailing newline); the
    details are left out when there are none."""
    details = render_details(plan)
    return _shown(render_summary(plan, config) + ([""] + details if details else []))


def _shown(lines: Sequence[str]) -> str:
    """The lines joined, each :func:`~nvshim.errors.one_line` (escaped, cut): a value from
    the bundle or a journal (an env value, an annotation, a reason) adds no line."""
    from nvshim.errors import one_line

    return "\n".join(one_line(line) for line in lines)


# --- a live bundle: config.json already rewritten by nvshim-runtime --------------------------


def rewritten_mark(spec: object) -> Optional[str]:
    """The value of nvshim's :data:`~nvshim.runtime.create.REWRITTEN` annotation in a
    config.json; None when nvshim-runtime has not rewritten it."""
    from nvshim.runtime.create import REWRITTEN

    annotations = spec.get("annotations") if isinstance(spec, dict) else None
    mark = annotations.get(REWRITTEN) if isinstance(annotations, dict) else None
    return mark if isinstance(mark, str) else None


def _latest_for(records: Sequence[Any], bundle: str) -> Any:
    found = [r for r in records if r.bundle == bundle]
    return max(found, key=lambda r: r.time) if found else None


def live_summary(spec_path: str, spec: Dict[str, Any], mark: str, config: Config) -> Dict[str, Any]:
    """What a live bundle holds, from the journals rather than a new plan: the latest
    grant and denial records of this bundle, its identity and the device nodes in it."""
    import os

    from nvshim.errors import HostError
    from nvshim.runtime.denials import denials_path, read_denials
    from nvshim.runtime.grants import read_grants
    from nvshim.runtime.identity import identity_of

    bundle = os.path.dirname(spec_path)
    grant = denial = None
    problems: List[str] = []
    if config.grants_journal:
        try:
            grant = _latest_for(read_grants(config.grants_journal), bundle)
        except HostError as exc:
            problems.append(str(exc))
        try:
            denial = _latest_for(read_denials(denials_path(config.grants_journal)) or [], bundle)
        except HostError as exc:
            problems.append(str(exc))
    annotations = spec.get("annotations")
    identity = identity_of(annotations) if isinstance(annotations, dict) else None
    linux = spec.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    nodes = (
        sorted({str(d.get("path")) for d in devices if isinstance(d, dict)})
        if isinstance(devices, list)
        else []
    )
    from nvshim.runtime.create import SERVED_BY

    served = annotations.get(SERVED_BY) if isinstance(annotations, dict) else None
    return {
        "bundle_config": spec_path,
        "config_file": config.source,
        "rewritten_by_nvshim": True,
        "mark": mark,
        # which path served the create: the resident agent's fast path or the runtime's
        # own Python (the annotation is only written by the agent)
        "served_by": served if served == "agent" else "nvshim-runtime",
        "container": str(identity) if identity else None,
        "journal": config.grants_journal,
        "journal_problems": problems,
        "grant": None
        if grant is None
        else {
            "container_id": grant.container_id,
            "time": grant.time,
            "gpus": list(grant.gpus),
            "source": grant.source,
            "verified": grant.verified,
            "shared": grant.shared,
            "root": grant.root,
            "runtime": grant.runtime,
        },
        "denial": None
        if denial is None
        else {
            "container_id": denial.container_id,
            "time": denial.time,
            "action": denial.action,
            "reason": denial.reason,
            "asked": list(denial.asked),
        },
        "device_nodes": nodes,
    }


def render_live(summary: Dict[str, Any]) -> str:
    """The live bundle in text: that it was rewritten, the journal's records for it, the
    device nodes config.json holds now."""
    import time

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    out = [
        f"bundle:        {summary['bundle_config']}",
        f"config:        {summary['config_file'] or '(defaults)'}",
    ]
    if summary["container"]:
        out.append(f"container:     {summary['container']}")
    grant, denial = summary["grant"], summary["denial"]
    if grant is not None:
        out.extend(
            f"granted:       {uuid}  (source {grant['source']}, verified {grant['verified']})"
            for uuid in grant["gpus"]
        )
        out.append(
            f"journal:       grant of container {grant['container_id']} at "
            f"{when(grant['time'])} in {summary['journal']}"
        )
    if denial is not None:
        out.append(f"denied:        {denial['action']}: asked {', '.join(denial['asked']) or '-'}")
        out.append(f"reason:        {denial['reason']}")
        out.append(
            f"journal:       denial of container {denial['container_id']} at {when(denial['time'])}"
        )
    if grant is None and denial is None:
        where = summary["journal"] or "nowhere (grants-journal is off)"
        out.append(f"journal:       no record of this bundle in {where}")
    out.extend(f"warning:       {p}" for p in summary["journal_problems"])
    out.append(f"device nodes:  {' '.join(summary['device_nodes']) or '-'}")
    out.append(f"nvshim mark:   {summary['mark']}")
    served = summary.get("served_by", "nvshim-runtime")
    out.append(f"served by:     {'the nvshim agent (fast path)' if served == 'agent' else served}")
    out.append(
        "config.json:   already rewritten by nvshim-runtime (live bundle): not planned again"
    )
    return _shown(out)
