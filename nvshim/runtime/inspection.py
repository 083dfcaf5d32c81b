"""What ``nvshim inspect`` shows of a create plan: a summary, its text form and the diff.

Reads a :class:`~nvshim.runtime.create.Plan` (what create would do to a bundle) and the
config it was made with; writes nothing. Not on the create path: only the ``nvshim``
command imports it. (Not named ``inspect``: that would shadow the standard library's
module for anything run with this directory on ``sys.path``.)
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    from nvshim.config import Config
    from nvshim.runtime.create import Plan

__all__ = ["env_set", "plan_summary", "plan_diff", "render_text"]


def _env(spec: Any) -> List[str]:
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


def plan_summary(plan: Plan, config: Config) -> Dict[str, Any]:
    """The plan as plain JSON values: the request, what was granted, the edits, who does the
    in-root work, where the node plan and CDI registry came from."""
    from nvshim.runtime.tokens import describe_indices

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
        "granted_gpus": [
            {"index": g.index, "minor": g.minor, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id}
            for g in plan.gpus
        ],
        "granted_mig": [
            {"device": f"{p.index}:{m.index}", "uuid": m.uuid} for p, m in plan.migs
        ],
        "cdi_devices": list(plan.cdi_names),
        # a MIG device brings its parent GPU's node: one node, listed once
        "device_nodes": sorted({n.path for n in plan.edits.device_nodes}),
        "notes": list(plan.notes),
        "missing_files": list(plan.missing),
        "env_set": env,
        "edits": plan.applied_edits().to_cdi(),
        "rootfs_work": {"by": plan.rootwork_by or None, "detail": plan.rootwork_why or None},
        "node_plan": plan.plan_source or None,
        "cdi_registry": plan.cdi_source or None,
        "changes_config": plan.changed,
        "container": str(plan.identity) if plan.identity else None,
        "verified": plan.verified,
        "kubelet_allocation": list(plan.allocation.ids) if plan.allocation else None,
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
    after = dumps(plan.new_spec, plan.original, indent=2, sort_keys=True).splitlines(
        keepends=True)
    return "".join(
        difflib.unified_diff(before, after, "config.json", "config.json (after nvshim)")
    )


def render_text(plan: Plan, config: Config) -> str:
    """The summary as aligned ``label:  value`` lines (no diff, no trailing newline)."""
    summary = plan_summary(plan, config)
    request = plan.request
    out: List[str] = []
    out.append(f"bundle:        {plan.spec_path}")
    out.append(f"config:        {config.source or '(defaults)'}"
               f"{' [require-allocation]' if config.require_allocation else ''}")
    if plan.identity is not None:
        out.append(f"container:     {plan.identity}")
    out.append(f"request from:  {summary['source']}")
    if plan.allocation is not None:
        out.append(f"verified:      kubelet ({plan.allocation.via}): allocated "
                   f"{', '.join(plan.allocation.ids) or 'no GPU'}")
    elif plan.verified == "unreachable":
        out.append("verified:      no: the kubelet was unreachable, claims trusted")
    files_only = "  (driver files only)" if request.driver_files and not request.devices else ""
    out.append(f"requested:     {', '.join(summary['requested']) or '-'}{files_only}")
    if request.injects:
        out.append(f"capabilities:  {', '.join(summary['capabilities'])}")
    if plan.gpus:
        out.append("granted GPUs:")
        for g in plan.gpus:
            out.append(f"  {g.index}  /dev/nvidia{g.minor}  {g.uuid}  {g.pci_bus_id}  {g.model}")
    for p, m in plan.migs:
        out.append(f"granted MIG:   {p.index}:{m.index}  {m.uuid}")
    if plan.cdi_names:
        out.append(f"CDI devices:   {', '.join(plan.cdi_names)}")
    if summary["device_nodes"]:
        out.append(f"device nodes:  {' '.join(summary['device_nodes'])}")
    mounts = [m.container_path for m in plan.edits.mounts]
    if mounts:
        out.append(f"mounts:        {len(mounts)} driver files")
        out.extend(f"  {m}" for m in mounts)
    if plan.missing:
        out.append(f"missing:       {', '.join(plan.missing)}: expected for the requested "
                   "capabilities, not found under the driver root")
    if plan.plan_source:
        out.append(f"node plan:     {plan.plan_source}")
    if plan.cdi_source:
        out.append(f"CDI registry:  {plan.cdi_source}")
    if plan.rootwork_by == "runtime":
        out.append(f"in-root work:  by nvshim-runtime before runc, in {plan.rootwork_why}")
    elif plan.rootwork_by == "nobody":
        out.append(f"in-root work:  none ({plan.rootwork_why})")
    elif plan.rootwork_by:
        out.append(f"in-root work:  by the createContainer hook ({plan.rootwork_why})")
    for hook in plan.applied_edits().hooks:
        out.append(f"hook:          {hook.hook_name}: {' '.join(hook.args)}")
    for note in plan.notes:
        out.append(f"note:          {note}")
    for entry in summary["env_set"]:
        why = ""
        if entry == "NVIDIA_VISIBLE_DEVICES=void":
            why = (" (image value stripped)" if request.set_void else
                   " (after injection, so nothing downstream injects again)")
        out.append(f"env:           {entry}{why}")
    rewrite = "would be rewritten" if plan.changed else "unchanged (byte-identical)"
    out.append(f"config.json:   {rewrite}")
    return "\n".join(out)
