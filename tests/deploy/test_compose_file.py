"""docker-compose.yml and deploy/, validated without a Docker engine (none runs here).

What can go wrong without running the stack is checked: the file parses, every mounted host
path and build context exists, host ports do not clash, every service the others wait for has
a healthcheck, the worker's environment names only settings the code reads, Prometheus scrapes
the port the worker serves, and promtool accepts the configuration and the rules.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_jobs.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
SECRET_VARIABLES = {"PRIVGW_SECRET", "PRIVGW_SECRET_FILE"}
PROMTOOL = shutil.which("promtool")


def test_the_stack_has_its_five_parts() -> None:
    assert {"kafka", "privgw", "simulator", "prometheus", "grafana"} <= set(SERVICES)
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    env = SERVICES["kafka"]["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper


def test_mounted_host_paths_and_build_contexts_exist() -> None:
    named = set(COMPOSE.get("volumes") or {})
    for name, svc in SERVICES.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source in named:
                continue
            assert source.startswith("./"), f"{name}: unnamed volume {source}"
            assert (ROOT / source).exists(), f"{name} mounts missing {source}"
        build = svc.get("build")
        if build is not None:
            context = ROOT / build["context"]
            assert context.is_dir(), name
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name


def test_host_ports_do_not_clash() -> None:
    ports = [str(p).split(":")[0] for svc in SERVICES.values() for p in svc.get("ports", [])]
    assert len(ports) == len(set(ports)), ports


def test_dependencies_wait_for_health_or_completion() -> None:
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            condition = cond["condition"]
            assert condition in {"service_healthy", "service_completed_successfully"}, name
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{dep} has no healthcheck"


@pytest.mark.parametrize("service", ["privgw", "simulator"])
def test_privgw_environment_names_only_real_settings(service: str) -> None:
    known = {f"PRIVGW_{f.upper()}" for f in WorkerSettings.model_fields} | SECRET_VARIABLES
    env = SERVICES[service].get("environment", {})
    unknown = sorted(k for k in env if k.startswith("PRIVGW_") and k not in known)
    assert not unknown, unknown
    # and the values are valid settings
    values = {
        k.removeprefix("PRIVGW_").lower(): v for k, v in env.items() if k not in SECRET_VARIABLES
    }
    WorkerSettings(**values)


def test_prometheus_scrapes_the_port_the_worker_serves() -> None:
    env = SERVICES["privgw"]["environment"]
    assert env["PRIVGW_METRICS_HOST"] == "0.0.0.0"  # reachable from the Prometheus container
    port = env["PRIVGW_METRICS_PORT"]
    assert f"{port}:{port}" in SERVICES["privgw"]["ports"]
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = [
        t
        for job in prom["scrape_configs"]
        if job["job_name"] == "privgw"
        for sc in job["static_configs"]
        for t in sc["targets"]
    ]
    assert targets == [f"privgw:{port}"]


def test_worker_image_is_slim_and_unprivileged() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}
    for copied in ("gateway", "state", "stream_jobs", "deploy/policies"):
        assert (ROOT / copied).exists()


def test_grafana_provisioning_points_at_the_mounted_dashboards() -> None:
    grafana = SERVICES["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    board_dir = mounts["./deploy/grafana/dashboards"]
    provider = yaml.safe_load(
        (ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "privgw.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == board_dir
    datasource = yaml.safe_load(
        (
            ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
        ).read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


@pytest.mark.skipif(PROMTOOL is None, reason="needs Debian's prometheus package")
@pytest.mark.parametrize(
    "args",
    [
        ("check", "config", "prometheus.yml"),
        ("check", "rules", "alerts.yml"),
        ("test", "rules", "alerts_test.yml"),
    ],
    ids=["config", "rules", "rule-unit-tests"],
)
def test_promtool_accepts_config_and_rules(args: tuple[str, ...]) -> None:
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, *args],
        cwd=ROOT / "deploy" / "prometheus",
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
