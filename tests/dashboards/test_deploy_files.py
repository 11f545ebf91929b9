"""The deployment files parse, name only files that exist in the repository, use only public
base images (or ours, built from a Dockerfile here on a public base), and agree with each
other: ports, the scrape's ``honor_labels``, provisioning paths, Ray versions.

No Docker engine or Kubernetes runs here, so this is what can be checked without one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from grafana_model import REPO_ROOT, load_dashboard

DEPLOY = REPO_ROOT / "deploy"
PROVISIONING = REPO_ROOT / "dashboards" / "provisioning"
RAY_VERSION = "2.60.0"
#: Every public image the deployment files use.
PUBLIC_IMAGES = {
    "python:3.11-slim",
    f"rayproject/ray:{RAY_VERSION}-py311-cpu",
    f"rayproject/ray:{RAY_VERSION}-py311-gpu",
    "prom/prometheus:v3.5.0",
    "grafana/grafana:11.6.0",
}
#: Our images (repository name -> the Dockerfile that builds them, from the repo root).
OUR_IMAGES = {"gradwire/coordinator": DEPLOY / "Dockerfile", "gradwire/ray": DEPLOY / "Dockerfile.ray"}
COORDINATOR_PORT = 8321


def _yaml_files() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml"), *PROVISIONING.rglob("*.yml")])


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _walk(node: Any, key_pattern: str) -> Iterator[Any]:
    """Values of every mapping key matching ``key_pattern``, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if re.fullmatch(key_pattern, str(key)):
                yield value
            yield from _walk(value, key_pattern)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item, key_pattern)


def _assert_image_allowed(image: str, where: str) -> None:
    repository = image.rsplit(":", 1)[0]
    assert image in PUBLIC_IMAGES or repository in OUR_IMAGES, f"{where}: image {image!r} is not allowed"


def _dockerfile_bases(path: Path) -> list[str]:
    """FROM images, with ``ARG`` defaults substituted as docker build would without --build-arg."""
    args: dict[str, str] = {}
    bases = []
    for line in path.read_text().splitlines():
        if match := re.match(r"\s*ARG\s+(\w+)=(\S+)", line):
            args[match.group(1)] = match.group(2)
        elif match := re.match(r"\s*FROM\s+(\S+)", line, re.IGNORECASE):
            bases.append(re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), match.group(1)))
    return bases


def test_every_yaml_file_parses():
    files = _yaml_files()
    assert len(files) >= 8, files
    for path in files:
        assert _documents(path), f"{path} is empty"


def test_every_image_is_public_or_ours():
    seen = set()
    for path in _yaml_files():
        for doc in _documents(path):
            for image in _walk(doc, r"image|head_image|worker_image"):
                _assert_image_allowed(image, str(path.relative_to(REPO_ROOT)))
                seen.add(image)
    assert {"grafana/grafana:11.6.0", "prom/prometheus:v3.5.0"} <= seen


@pytest.mark.parametrize("dockerfile", sorted(OUR_IMAGES.values()), ids=lambda p: p.name)
def test_our_dockerfiles_build_on_public_images_from_files_that_exist(dockerfile):
    bases = _dockerfile_bases(dockerfile)
    assert bases and all(base in PUBLIC_IMAGES for base in bases), bases
    text = dockerfile.read_text()
    assert "download.pytorch.org/whl/cpu" in text, "CPU torch from the PyTorch CPU index"
    for line in text.splitlines():
        if match := re.match(r"\s*COPY\s+(?:--\S+\s+)*(.+)\s+\S+\s*$", line):
            for source in match.group(1).split():
                assert (REPO_ROOT / source).exists(), f"{dockerfile.name}: COPY {source} (build context = repo root)"


def test_coordinator_image_serves_on_all_interfaces_and_requires_a_token():
    text = (DEPLOY / "Dockerfile").read_text()
    assert _dockerfile_bases(DEPLOY / "Dockerfile") == ["python:3.11-slim"]
    cmd = [line for line in text.splitlines() if line.startswith("CMD")][-1]
    assert "gradwire serve --host 0.0.0.0" in cmd and "${GRADWIRE_TOKEN:?" in cmd
    assert f"EXPOSE {COORDINATOR_PORT}" in text
    assert f"ARG RAY_VERSION={RAY_VERSION}" in text


def test_prometheus_scrapes_the_coordinator_with_honor_labels():
    (config,) = _documents(DEPLOY / "prometheus.yml")
    (scrape,) = [s for s in config["scrape_configs"] if s["job_name"] == "gradwire"]
    assert scrape["honor_labels"] is True, "without it our `job` label becomes `exported_job`"
    targets = [t for group in scrape["static_configs"] for t in group["targets"]]
    assert targets == [f"coordinator:{COORDINATOR_PORT}"]
    interval = config["global"]["scrape_interval"]
    (datasource,) = _documents(PROVISIONING / "datasources" / "prometheus.yml")[0]["datasources"]
    assert datasource["jsonData"]["timeInterval"] == interval


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not found")
def test_promtool_accepts_the_prometheus_config():
    result = subprocess.run(["promtool", "check", "config", "--syntax-only", str(DEPLOY / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _compose() -> dict[str, Any]:
    (compose,) = _documents(DEPLOY / "docker-compose.yml")
    return compose


def _bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path, container path) of the bind mounts (sources with a path, not volume names)."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append(((DEPLOY / source).resolve(), target))
    return mounts


def test_compose_builds_and_mounts_files_that_exist():
    services = _compose()["services"]
    assert {"coordinator", "ray-head", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        if "build" in service:
            context = (DEPLOY / service["build"]["context"]).resolve()
            dockerfile = context / service["build"]["dockerfile"]
            assert context == REPO_ROOT and dockerfile.exists(), name
            assert OUR_IMAGES[service["image"].rsplit(":", 1)[0]] == dockerfile, f"{name}: image/Dockerfile mismatch"
        else:
            assert service["image"] in PUBLIC_IMAGES, name
        for source, _ in _bind_mounts(service):
            assert source.exists(), f"{name} mounts {source}, which does not exist"
            assert REPO_ROOT in source.parents, f"{name} mounts {source} from outside the repository"


def test_compose_wiring():
    services = _compose()["services"]
    coordinator = services["coordinator"]
    assert f"{COORDINATOR_PORT}:{COORDINATOR_PORT}" in coordinator["ports"]
    assert coordinator["environment"]["GRADWIRE_TOKEN"].startswith("${GRADWIRE_TOKEN:?"), "the token is required"
    assert coordinator["environment"]["GRADWIRE_RAY_ADDRESS"] == "ray://ray-head:10001"
    assert "ray-client-server-port=10001" in services["ray-head"]["command"]
    assert (DEPLOY / "prometheus.yml").resolve() in [s for s, _ in _bind_mounts(services["prometheus"])]

    grafana = dict((target, source) for source, target in _bind_mounts(services["grafana"]))
    assert grafana["/etc/grafana/provisioning/datasources"] == PROVISIONING / "datasources"
    assert grafana["/etc/grafana/provisioning/dashboards"] == PROVISIONING / "dashboards"
    (provider,) = _documents(PROVISIONING / "dashboards" / "gradwire.yml")[0]["providers"]
    dashboards_dir = grafana[provider["options"]["path"]]
    assert (dashboards_dir / "gradwire.json").exists(), "the provider's path must hold the dashboard JSON"


def test_provisioned_datasource_is_the_one_the_dashboard_uses():
    (datasource,) = _documents(PROVISIONING / "datasources" / "prometheus.yml")[0]["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert datasource["uid"] in load_dashboard()["panels"][1]["datasource"]["uid"]


def _kuberay() -> dict[str, list[dict[str, Any]]]:
    docs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((DEPLOY / "kuberay").glob("*.yaml")):
        for doc in _documents(path):
            assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), path
            docs.setdefault(doc["kind"], []).append(doc)
    return docs


def test_kuberay_manifests_fit_together():
    docs = _kuberay()
    assert {"RayCluster", "Deployment", "Service", "ServiceMonitor", "RayJob"} <= set(docs)
    (cluster,) = docs["RayCluster"]
    assert cluster["spec"]["rayVersion"] == RAY_VERSION
    assert all(job["spec"]["rayClusterSpec"]["rayVersion"] == RAY_VERSION for job in docs["RayJob"])

    (deployment,) = [d for d in docs["Deployment"] if d["metadata"]["name"] == "gradwire-coordinator"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["GRADWIRE_TOKEN"]["valueFrom"]["secretKeyRef"]
    # KubeRay names the head service <cluster name>-head-svc; 10001 is Ray Client's port.
    assert env["GRADWIRE_RAY_ADDRESS"]["value"] == f"ray://{cluster['metadata']['name']}-head-svc:10001"
    assert any(p["containerPort"] == COORDINATOR_PORT for p in container["ports"])

    (service,) = [s for s in docs["Service"] if s["metadata"]["name"] == "gradwire-coordinator"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == COORDINATOR_PORT
    assert env["GRADWIRE_PUBLIC_URL"]["value"] == f"http://{service['metadata']['name']}:{COORDINATOR_PORT}"

    (monitor,) = docs["ServiceMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True

    claims = {c["metadata"]["name"] for c in docs["PersistentVolumeClaim"]}
    for doc in [*docs["RayCluster"], *docs["Deployment"]]:
        for claim in _walk(doc, "claimName"):
            assert claim in claims, f"{doc['metadata']['name']} mounts missing claim {claim}"


def test_ray_up_config_for_aws():
    (config,) = _documents(DEPLOY / "ray-cluster.yaml")
    assert config["provider"]["type"] == "aws"
    assert config["head_node_type"] in config["available_node_types"]
    for image in (config["docker"]["head_image"], config["docker"]["worker_image"]):
        assert image in PUBLIC_IMAGES
    # file_mounts are {path on the node: local path}; `ray up` runs from the repository root.
    for local in config["file_mounts"].values():
        assert (REPO_ROOT / local).resolve() == REPO_ROOT or (REPO_ROOT / local).exists(), local
    commands = " ".join(config["head_setup_commands"] + config["worker_setup_commands"])
    assert "pip install -q -e /home/ray/gradwire" in commands
