"""docker-compose.yml and deploy/, validated without a Docker engine (none runs here;
tests/deploy/test_stack.py runs the same topology with real binaries).

What can go wrong without running the stack is checked: the file parses, every mounted host
path and build context exists, host ports do not clash and are published on 127.0.0.1 unless
STACK_BIND_ADDRESS opts in, every service the others wait for has a healthcheck, the worker's
environment names only settings the code reads, Prometheus scrapes the port the worker serves
and sends alerts to Alertmanager, promtool and amtool accept the configuration and the rules,
no password is written in the file, the worker's stop grace outlasts its own shutdown grace,
and long-running services restart.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy import load_policy
from stream_jobs.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
SECRET_VARIABLES = {"PRIVGW_SECRET", "PRIVGW_SECRET_FILE"}
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
COMPOSE_BIN = shutil.which("docker-compose")
LONG_RUNNING = {"kafka", "privgw", "prometheus", "alertmanager", "alert-sink", "grafana"}


def published(service: str, bind: str = "127.0.0.1") -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of a service's ports, STACK_BIND_ADDRESS
    interpolated as `docker compose` does (``bind``: its value; default 127.0.0.1)."""
    out = []
    for spec in SERVICES[service].get("ports", []):
        text = str(spec).replace("${STACK_BIND_ADDRESS:-127.0.0.1}", bind)
        host, host_port, container = text.split(":")
        out.append((host, host_port, container))
    return out


def test_the_stack_has_its_parts() -> None:
    assert {"kafka", "privgw", "simulator", "prometheus", "alertmanager", "alert-sink",
            "grafana"} <= set(SERVICES)  # fmt: skip
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


def test_host_ports_do_not_clash_and_stay_on_loopback_by_default() -> None:
    ports = [p for name in SERVICES for p in published(name)]
    assert len({p[1] for p in ports}) == len(ports), ports
    assert {p[0] for p in ports} == {"127.0.0.1"}, ports
    for name in SERVICES:  # opted in: everything but Kafka's unauthenticated host listener
        for host, _, _ in published(name, bind="0.0.0.0"):
            assert host == ("127.0.0.1" if name == "kafka" else "0.0.0.0"), name


@pytest.mark.skipif(COMPOSE_BIN is None, reason="needs docker-compose")
@pytest.mark.parametrize("bind", [None, "0.0.0.0"], ids=["default", "opted-in"])
def test_docker_compose_config_publishes_nothing_beyond_loopback_unless_told(
    bind: str | None,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STACK_BIND_ADDRESS"}
    if bind is not None:
        env["STACK_BIND_ADDRESS"] = bind
    proc = subprocess.run(
        ["docker-compose", "-f", "docker-compose.yml", "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    hosts = {
        name: [str(p).split(":")[0] for p in svc.get("ports", [])]
        for name, svc in config["services"].items()
    }
    assert any(hosts.values())
    for name, addresses in hosts.items():
        expected = "127.0.0.1" if bind is None or name == "kafka" else bind
        assert all(a == expected for a in addresses), (name, addresses)


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
    assert ("127.0.0.1", port, port) in published("privgw")
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


def test_kafka_keeps_its_log_in_the_named_volume() -> None:
    kafka = SERVICES["kafka"]
    log_dirs = kafka["environment"]["KAFKA_LOG_DIRS"]
    mounts = dict(v.split(":")[:2] for v in kafka["volumes"])
    assert mounts.get("kafka-data") == log_dirs
    assert "kafka-data" in COMPOSE["volumes"]


def test_the_host_can_read_the_protected_topic() -> None:
    env = SERVICES["kafka"]["environment"]
    listeners = dict(x.split("://") for x in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    host, port = listeners["HOST"].rsplit(":", 1)
    assert host == "localhost"
    assert f"127.0.0.1:{port}:{port}" in SERVICES["kafka"]["ports"]  # not on the network
    assert f"HOST://:{port}" in env["KAFKA_LISTENERS"]
    assert "HOST:PLAINTEXT" in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    readme = (ROOT / "README.md").read_text()
    assert f"--bootstrap localhost:{port} --topic survey.protected" in readme


def test_the_input_topic_is_created_before_the_worker_starts() -> None:
    """The worker never creates its input topic: the stack does, from the policy's name."""
    policy = yaml.safe_load((ROOT / "deploy" / "policies" / "adult.yaml").read_text())
    command = SERVICES["topics-init"]["command"]
    assert command[command.index("--topic") + 1] == policy["input"]["topic"]
    # it keeps an open wave's records, read but unpublished, twice the policy's wait
    configs = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--config")
    wait = load_policy(ROOT / "deploy" / "policies" / "adult.yaml").longest_wait
    assert int(configs["retention.ms"]) >= wait.retention_ms
    depends = SERVICES["privgw"]["depends_on"]["topics-init"]
    assert depends["condition"] == "service_completed_successfully"
    assert "/readyz" in " ".join(SERVICES["privgw"]["healthcheck"]["test"])


def test_the_image_installs_pinned_versions_with_the_extras_the_readme_needs() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert 'pip install --constraint constraints.txt ".[embedded,rocksdb]"' in text
    pins = {}
    for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    assert pins and all(pins.values())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [
        d for extra in ("embedded", "rocksdb") for d in project["optional-dependencies"][extra]
    ]
    for dep in wanted:
        name = re.match(r"[A-Za-z0-9._-]+", dep).group().lower()  # before extras and versions
        assert name in pins, f"{name} has no pinned version in deploy/constraints.txt"
    # what aiokafka's codec extras install (snappy, lz4, zstd)
    assert "cramjam" in pins, "cramjam has no pinned version in deploy/constraints.txt"


def test_the_readme_says_the_dead_letters_need_the_inputs_access_control() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "raw input bytes" in readme and "same access control as the input" in readme


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="needs docker-compose")
def test_docker_compose_accepts_the_file() -> None:
    proc = subprocess.run(
        ["docker-compose", "-f", "docker-compose.yml", "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_secret_init_creates_the_secret_with_the_cli_once(tmp_path: Path) -> None:
    """The service's own command, run twice as on a second `up`: the CLI writes the secret
    (mode 0600) the first time; the second run keeps it and succeeds."""
    service = SERVICES["secret-init"]
    secret_file = SERVICES["privgw"]["environment"]["PRIVGW_SECRET_FILE"]
    assert service["entrypoint"] == ["/bin/sh", "-c"]
    [command] = service["command"]
    assert f"privgw secret create {secret_file}" in command
    target = tmp_path / "secret.key"
    script = command.replace(secret_file, str(target))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PRIVGW_SECRET", None)
    env.pop("PRIVGW_SECRET_FILE", None)
    first = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert first.returncode == 0, first.stderr
    assert "key fingerprint" in first.stdout
    secret = target.read_bytes()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    again = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert again.returncode == 0, again.stderr
    assert target.read_bytes() == secret


def test_prometheus_has_no_lifecycle_api_and_alerts_go_to_alertmanager() -> None:
    command = " ".join(SERVICES["prometheus"]["command"])
    assert "enable-lifecycle" not in command and "enable-admin-api" not in command
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    [target] = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert target == "alertmanager:9093"
    am = SERVICES["alertmanager"]
    assert "--cluster.listen-address=" in am["command"]  # no cluster port on every interface
    mounts = dict(v.split(":")[:2] for v in am["volumes"])
    assert mounts["./deploy/alertmanager"] == "/etc/alertmanager"
    config = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    urls = [h["url"] for r in config["receivers"] for h in r.get("webhook_configs", [])]
    assert urls == ["http://alert-sink:9095/"]
    assert 'SINK_PORT", "9095"' in SERVICES["alert-sink"]["command"][0]


@pytest.mark.skipif(AMTOOL is None, reason="needs Debian's prometheus-alertmanager")
def test_amtool_accepts_the_alertmanager_config() -> None:
    assert AMTOOL is not None
    proc = subprocess.run(
        [AMTOOL, "check-config", "deploy/alertmanager/alertmanager.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_password_is_written_in_the_stack() -> None:
    text = (ROOT / "docker-compose.yml").read_text().lower()
    assert "admin_password:" not in text.replace("admin_password__file:", "")
    grafana = SERVICES["grafana"]
    path = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    assert mounts["grafana-secret"] == str(Path(path).parent)
    assert grafana["depends_on"]["grafana-secret-init"]["condition"] == (
        "service_completed_successfully"
    )


def test_grafana_secret_init_generates_the_password_once(tmp_path: Path) -> None:
    [command] = SERVICES["grafana-secret-init"]["command"]
    path = SERVICES["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    target = tmp_path / "admin-password"
    script = command.replace(path, str(target))
    if os.geteuid() != 0:  # the container runs it as root, to give the file to Grafana
        script = script.replace("&& chown 472 " + str(target), "")
    passwords = []
    for _ in range(2):  # as on a second `up`: kept
        done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
        passwords.append(target.read_text())
    assert passwords[0] == passwords[1]
    assert len(passwords[0]) == 32 and passwords[0].isalnum()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60}
    return float(text[:-1]) * units[text[-1]]


def test_the_worker_gets_longer_than_its_own_shutdown_grace() -> None:
    svc = SERVICES["privgw"]
    grace = float(svc["environment"]["PRIVGW_SHUTDOWN_GRACE_SECONDS"])
    assert grace == WorkerSettings.model_fields["shutdown_grace_seconds"].default
    assert _seconds(svc["stop_grace_period"]) >= grace + 10  # clients, engine, exit


def test_long_running_services_restart_and_images_are_pinned() -> None:
    for name in LONG_RUNNING:
        assert SERVICES[name].get("restart") in {"unless-stopped", "always"}, name
    for name, svc in SERVICES.items():
        image = svc.get("image", "")
        if "build" in svc:
            continue
        repo, _, tag = image.partition(":")
        assert repo and tag and tag != "latest" and any(c.isdigit() for c in tag), name
    head = (ROOT / "docker-compose.yml").read_text().split("services:")[0]
    assert "digest" in head  # why not by digest, and how to pin one, is said
