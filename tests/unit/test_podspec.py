"""The pod-spec → CRI translation the DaemonSet e2e test runs manifests through (tests/helpers/podspec.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim import _protobuf as proto
from tests.helpers.cri import CONTAINER, NODE, POD
from tests.helpers.podspec import (
    MASKED_PATHS,
    PodIdentity,
    container_spec,
    pod_template,
    quantity,
    sandbox_spec,
)

WHO = PodIdentity("p", "ns", "uid-1", "node-1")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def pod(**spec: Any) -> Dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "i"}], **spec},
    }


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({}, (POD, CONTAINER, POD)),
        ({"hostPID": True}, (POD, NODE, POD)),
        ({"hostNetwork": True, "hostIPC": True}, (NODE, CONTAINER, NODE)),
        ({"shareProcessNamespace": True}, (POD, POD, POD)),
    ],
)
def test_namespaces_follow_the_host_fields(spec: Dict[str, Any], expected: Any) -> None:
    """hostNetwork/hostPID/hostIPC/shareProcessNamespace become the sandbox's NamespaceOption as the kubelet sets it."""
    ns = sandbox_spec(pod(**spec), WHO, "/kubepods").namespaces
    assert (ns.network, ns.pid, ns.ipc) == expected


def test_the_daemonsets_template_translates_without_unknown_fields() -> None:
    """Every field of deploy/daemonset.yaml's pod template is one the translator knows (a new one fails here first)."""
    template = pod_template(DEPLOY / "daemonset.yaml")
    volumes = {v["name"]: f"/vol/{v['name']}" for v in template["spec"].get("volumes", [])}
    cm = {"nvshim-config": {"config.yaml": "x"}}
    sandbox = sandbox_spec(template, WHO, "/kubepods")
    assert sandbox.namespaces.pid == (NODE if template["spec"].get("hostPID") else CONTAINER)
    for c in [*template["spec"].get("initContainers", []), *template["spec"]["containers"]]:
        spec = container_spec(template, c, WHO, volumes, cm, 1 << 34)
        assert spec.image == c["image"]


def test_security_context_of_an_unprivileged_read_only_container() -> None:
    """runAsUser/Group, readOnlyRootFilesystem, allowPrivilegeEscalation: false and dropped capabilities reach the CRI config; the kubelet's masked paths are set."""
    c = {
        "name": "c",
        "image": "i",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    sc = container_spec(pod(), c, WHO, {}, {}, 1 << 34).security
    assert (
        sc.run_as_user,
        sc.run_as_group,
        sc.readonly_rootfs,
        sc.no_new_privs,
        tuple(sc.drop_capabilities),
        sc.privileged,
    ) == (65534, 65534, True, True, ("ALL",), False)
    assert tuple(sc.masked_paths) == MASKED_PATHS


def test_privileged_container_has_no_masked_paths() -> None:
    """A privileged container gets no masked or read-only paths, and its sandbox is marked privileged."""
    p = pod()
    p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    sc = container_spec(p, p["spec"]["containers"][0], WHO, {}, {}, 1 << 34).security
    assert sc.privileged and not sc.masked_paths and not sc.readonly_paths
    assert sandbox_spec(p, WHO, "/k").privileged


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("stdin", True, "['stdin'] not supported"),
        (
            "securityContext",
            {"procMount": "Unmasked"},
            "securityContext ['procMount'] not supported",
        ),
        (
            "securityContext",
            {"runAsNonRoot": True, "runAsUser": 0},
            "runAsNonRoot with runAsUser 0",
        ),
        ("env", [{"name": "X", "valueFrom": {"secretKeyRef": {}}}], "env X valueFrom"),
        ("resources", {"limits": {"hugepages-2Mi": "1Gi"}}, "resources ['hugepages-2Mi']"),
    ],
)
def test_what_it_does_not_know_is_an_error(field: str, value: Any, message: str) -> None:
    """A container field the translator cannot send as the kubelet would fails, naming it."""
    c = {"name": "c", "image": "i", field: value}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        container_spec(pod(), c, WHO, {}, {}, 1 << 34)


def test_env_mounts_and_resources() -> None:
    """env (value, fieldRef, configMapKeyRef), volumeMounts (readOnly, subPath, propagation) and resources become their CRI fields."""
    c = {
        "name": "c",
        "image": "i",
        "env": [
            {"name": "A", "value": "1"},
            {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        ],
        "volumeMounts": [
            {
                "name": "v",
                "mountPath": "/m",
                "readOnly": True,
                "subPath": "s",
                "mountPropagation": "HostToContainer",
            }
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
    }
    spec = container_spec(pod(), c, WHO, {"v": "/node/v"}, {"cm": {"k": "kv"}}, 1 << 34)
    assert list(spec.envs) == [("A", "1"), ("N", "node-1"), ("K", "kv")]
    (m,) = spec.mounts
    assert (m.container_path, m.host_path, m.readonly, m.propagation) == (
        "/m",
        "/node/v/s",
        True,
        1,
    )
    r = spec.resources
    assert (r.cpu_shares, r.cpu_quota, r.cpu_period, r.memory_limit) == (
        102,
        100000,
        100000,
        512 << 20,
    )


def test_wire_numbers_of_the_security_context() -> None:
    """ContainerConfig.linux(15).security_context(2) carries run_as_user(5).value(1), readonly_rootfs(7) and privileged(2), as cri-api's api.proto numbers them."""
    c = {
        "name": "c",
        "image": "i",
        "securityContext": {"runAsUser": 7, "readOnlyRootFilesystem": True},
    }
    config = proto.by_number(container_spec(pod(), c, WHO, {}, {}, 1 << 34).encode())
    linux = proto.by_number(next(iter(proto.messages(config, 15))))
    sc = proto.by_number(next(iter(proto.messages(linux, 2))))
    assert proto.by_number(next(iter(proto.messages(sc, 5)))) == {1: [7]}
    assert sc[7] == [1] and 2 not in sc


@pytest.mark.parametrize(
    "text, value", [("100m", 0.1), ("128Mi", 128 << 20), ("1", 1), ("2G", 2e9)]
)
def test_quantity(text: str, value: float) -> None:
    """Kubernetes quantities parse to their numbers."""
    assert quantity(text) == value
