"""The node plan cache's DRM section (issue 29): the GPUs' card and render nodes are found
when the plan is built, but stat'ed only by a create that asks for graphics or display, so
a compute,utility create checks no more paths than before DRM nodes existed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvshim.host.discovery import Host
from nvshim.runtime.planbuild import build
from nvshim.runtime.plancache import CachedHost, load, stamp

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the simulated node needs root (mknod)")


def _plan(tmp_path: Path, root: str) -> str:
    host = Host(root)
    doc = build(host)
    doc.update(stamp(host))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_drm_paths_are_a_section_of_their_own(tmp_path: Path) -> None:
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    doc = json.loads(Path(_plan(tmp_path, node.root)).read_text())
    assert not any("/dev/dri" in p or "/drm" in p for p, _ in doc["watch"])
    watched = [p for p, _ in doc["watchdrm"]]
    assert f"{node.root}/dev/dri/by-path" in watched
    assert sum(p.startswith(f"{node.root}/dev/dri/card") for p in watched) == 2
    assert sum(p.startswith(f"{node.root}/dev/dri/renderD") for p in watched) == 2


def test_a_changed_drm_node_leaves_compute_fresh_and_graphics_sees_it(tmp_path: Path) -> None:
    """A render node that goes keeps the plan fresh for everything but DRM; the DRM
    lookup of that create sees the change (looked up live), and the untouched GPU's nodes
    are right too."""
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    plan = _plan(tmp_path, node.root)
    cached, why = load(plan, node.root, node.root)
    assert isinstance(cached, CachedHost), why
    gpu0, gpu1 = cached.gpus()
    before = {g.index: [n.path for n in cached.drm(g).nodes] for g in (gpu0, gpu1)}
    render1 = next(p for p in before[1] if "renderD" in p)
    os.unlink(node.root + render1)

    cached, why = load(plan, node.root, node.root)
    assert isinstance(cached, CachedHost), why  # compute,utility: still answered by the plan
    assert [n.path for n in cached.drm(gpu1).nodes] == [p for p in before[1] if p != render1]
    assert [n.path for n in cached.drm(gpu0).nodes] == before[0]
    assert cached.gpus() == (gpu0, gpu1)


def test_memo_shares_the_records_of_one_plan_and_not_its_drm_check(tmp_path: Path) -> None:
    """Under a resident process's PlanMemo two creates on an unchanged plan share its frozen
    GPU records (made once), each still checks the DRM section itself, and a rewritten plan
    gets records of its own."""
    from nvshim.runtime.plancache import PlanMemo, use_memo
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    plan = _plan(tmp_path, node.root)
    use_memo(PlanMemo())
    try:
        first, _ = load(plan, node.root, node.root)
        second, _ = load(plan, node.root, node.root)
        assert isinstance(first, CachedHost) and isinstance(second, CachedHost)
        assert first is not second and first.gpus()[0] is second.gpus()[0]
        gpu1 = first.gpus()[1]
        render1 = next(n.path for n in first.drm(gpu1).nodes if "renderD" in n.path)
        os.unlink(node.root + render1)
        assert render1 not in [n.path for n in second.drm(gpu1).nodes]  # its own check
        Path(plan).write_text(Path(plan).read_text() + " ")  # the same plan, another file
        third, _ = load(plan, node.root, node.root)
        assert isinstance(third, CachedHost)
        assert third.gpus() == first.gpus() and third.gpus()[0] is not first.gpus()[0]
    finally:
        use_memo(None)
