"""Every request source × privilege × require-allocation × on-missing-allocation.

Expectations follow docs/kubernetes.md's rules, written out per case rather than computed by
the code under test.
"""

from __future__ import annotations

import itertools

import pytest

from nvshim.config import Config
from nvshim.errors import RequestError
from nvshim.runtime.claim import image_view, read_claim
from nvshim.runtime.request import resolve_request

UUID = "GPU-11111111-2222-3333-4444-555555555552"

SOURCES = {
    # name: (env, mounts, annotations)
    "nothing": ([], [], {}),
    "image-all": (["NVIDIA_VISIBLE_DEVICES=all"], [], {}),
    "image-index": (["NVIDIA_VISIBLE_DEVICES=1"], [], {}),
    "legacy-image": (["CUDA_VERSION=12.2"], [], {}),
    "envvar-uuid": ([f"NVIDIA_VISIBLE_DEVICES={UUID}"], [], {}),
    "volume-mount": (
        ["NVIDIA_VISIBLE_DEVICES=all"],
        [{"source": "/dev/null", "destination": f"/var/run/nvidia-container-devices/{UUID}"}],
        {},
    ),
    "cdi-annotation": (["NVIDIA_VISIBLE_DEVICES=all"], [], {"cdi.k8s.io/dp": "nvidia.com/gpu=2"}),
}


PRIVILEGE = {
    # name: (bounding set, device cgroup rules)
    "unprivileged": (["CAP_CHOWN"], [{"allow": False, "access": "rwm"}]),
    # securityContext.capabilities.add: [SYS_ADMIN] — not a privileged container
    "sys-admin-only": (["CAP_CHOWN", "CAP_SYS_ADMIN"], [{"allow": False, "access": "rwm"}]),
    # what --privileged / privileged: true gives (containerd, podman, docker)
    "privileged": (["CAP_CHOWN", "CAP_SYS_ADMIN"], [{"allow": True, "access": "rwm"}]),
}


def expected(source: str, privilege: str, require: bool, on_missing: str):
    """(outcome, devices): outcome is 'grant', 'strip', 'nothing' or 'fail'."""
    granted = {
        "image-all": ("all",),
        "image-index": ("1",),
        "legacy-image": ("all",),
        "envvar-uuid": (UUID,),
        "volume-mount": (UUID,),
        "cdi-annotation": ("nvidia.com/gpu=2",),
    }
    if source == "nothing":
        return "nothing", ()
    if not require:
        return "grant", granted[source]
    # require-allocation: allocations always count; env only as full UUIDs or when privileged
    if source in ("volume-mount", "cdi-annotation", "envvar-uuid"):
        return "grant", granted[source]
    # the privileged source: a privileged container (SYS_ADMIN alone is not one)
    if privilege == "privileged" and source != "legacy-image":
        return "grant", granted[source]
    # a privileged container holds every GPU node already: stripped, never failed
    return ("fail", ()) if on_missing == "fail" and privilege != "privileged" else ("strip", ())


CASES = list(itertools.product(SOURCES, PRIVILEGE, [False, True], ["strip", "fail"]))


@pytest.mark.parametrize(
    "source,privilege,require,on_missing", CASES, ids=["-".join(map(str, c)) for c in CASES]
)
def test_allocation_matrix(source, privilege, require, on_missing):
    """Each combination grants, strips (void), does nothing, or fails as documented."""
    env, mounts, annotations = SOURCES[source]
    caps, rules = PRIVILEGE[privilege]
    spec = {
        "process": {"env": env, "capabilities": {"bounding": caps}},
        "mounts": mounts,
        "annotations": annotations,
        "linux": {"resources": {"devices": rules}},
    }
    config = Config(require_allocation=require, on_missing_allocation=on_missing)
    outcome, devices = expected(source, privilege, require, on_missing)
    if outcome == "fail":
        with pytest.raises(RequestError, match="no device-plugin allocation was found"):
            resolve_request(read_claim(image_view(spec), config), config)
        return
    req = resolve_request(read_claim(image_view(spec), config), config)
    assert req.devices == devices
    assert req.injects == (outcome == "grant")
    assert req.set_void == (outcome == "strip")
