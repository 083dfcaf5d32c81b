"""management-pods: which CRI containers get what they ask for under require-allocation."""

from __future__ import annotations

import pytest

from nvshim.runtime.identity import management_pod

CRI = "io.kubernetes.cri."


def _ann(namespace: str, pod: str, container: str = "ctr") -> dict:
    return {
        f"{CRI}sandbox-namespace": namespace,
        f"{CRI}sandbox-name": pod,
        f"{CRI}container-name": container,
        f"{CRI}sandbox-uid": "u",
    }


@pytest.mark.parametrize(
    ("annotations", "patterns", "expected"),
    [
        (
            _ann("kube-system", "nvidia-device-plugin-ab"),
            ["kube-system/nvidia-device-plugin-*"],
            "kube-system/nvidia-device-plugin-*",
        ),
        (_ann("default", "nvidia-device-plugin-ab"), ["kube-system/nvidia-device-plugin-*"], None),
        (_ann("kube-system", "dcgm"), ["kube-system/nvidia-device-plugin-*"], None),
        (_ann("gpu-operator", "p", "plugin"), ["gpu-operator/*/plugin"], "gpu-operator/*/plugin"),
        (_ann("gpu-operator", "p", "sidecar"), ["gpu-operator/*/plugin"], None),
        ({}, ["kube-system/*"], None),  # not a CRI container
        (_ann("kube-system", "x"), [], None),
    ],
)
def test_management_pod_matches_namespace_literally_and_names_by_glob(
    annotations: dict, patterns: list, expected: object
) -> None:
    """The namespace must equal the entry's; pod and container names match its globs; a
    container without containerd's CRI annotations never matches."""
    assert management_pod(annotations, patterns) == expected


def test_a_namespace_glob_is_rejected_by_the_schema(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """management-pods entries need a literal namespace: "*/x" is a config error."""
    from nvshim.config import load_config
    from nvshim.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text('management-pods: ["*/nvidia-device-plugin-*"]\n')
    with pytest.raises(ConfigError, match="management-pods"):
        load_config(str(path))
