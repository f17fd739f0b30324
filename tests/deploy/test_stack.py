"""The compose stack's topology brought up with real binaries (issue 30, item 4): no Docker
engine runs here, so each service of docker-compose.yml runs as the process it wraps, with
the stack's own configuration files — the development broker for Kafka (topics-init's topic
created the same way), `privgw secret create` as secret-init runs it, `privgw run` with the
privgw service's environment, `privgw simulate`, Debian's Prometheus with
deploy/prometheus/prometheus.yml and alerts.yml, Debian's Alertmanager with
deploy/alertmanager/alertmanager.yml, and the alert-sink service's own receiver script. Only
addresses change (every process on 127.0.0.1, free ports) and the alert's `for:` (promtool's
unit tests cover the timing).

The broker is then stopped: the worker's probe sees it, Prometheus fires
PrivgwBrokerUnreachable, Alertmanager routes it, and the notification reaches the receiver
with its runbook link.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from stream_jobs.commands.broker import EmbeddedBroker, free_port

pytestmark = [pytest.mark.broker, pytest.mark.prometheus]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
ALERT = "PrivgwBrokerUnreachable"


def _ready(url: str, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, f"{what} exited: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"{what} not ready in 60 s"
        time.sleep(0.2)


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return list(json.loads(resp.read())["data"]["result"])


def _start(args: list[str], log: Path, env: dict[str, str] | None = None) -> Any:
    with log.open("wb") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )


@pytest.mark.skipif(
    PROMETHEUS is None or ALERTMANAGER is None,
    reason="needs Debian's prometheus and prometheus-alertmanager (scripts/test installs them)",
)
def test_the_stack_fires_an_alert_that_reaches_the_receiver(tmp_path: Path) -> None:
    assert PROMETHEUS is not None and ALERTMANAGER is not None
    procs: list[subprocess.Popen[bytes]] = []
    broker = EmbeddedBroker(log_dir=tmp_path / "broker").start()
    try:
        # kafka + topics-init: the input topic the policy names, created by the operator
        topics = SERVICES["topics-init"]["command"]
        topic = topics[topics.index("--topic") + 1]
        config = dict(topics[i + 1].split("=", 1) for i, a in enumerate(topics) if a == "--config")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic(topic, 3, 1, config=config)]).values():
            future.result(30)
        del admin  # its connections go with it (it would log the broker's stop below)

        # secret-init: the service's own command
        svc = SERVICES["privgw"]
        env_spec = {k: str(v) for k, v in svc["environment"].items()}
        secret = tmp_path / "secret.key"
        [script] = SERVICES["secret-init"]["command"]
        bindir = str(Path(sys.executable).parent)
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVGW_")}
        base_env["PATH"] = f"{bindir}{os.pathsep}{base_env['PATH']}"
        subprocess.run(
            ["/bin/sh", "-c", script.replace(env_spec["PRIVGW_SECRET_FILE"], str(secret))],
            env=base_env,
            check=True,
            capture_output=True,
        )

        # alert-sink: its own script, on a free port
        sink_port = free_port()
        sink_log = tmp_path / "sink.log"
        [sink_script] = SERVICES["alert-sink"]["command"]
        procs.append(
            _start(
                [sys.executable, "-c", sink_script],
                sink_log,
                {**base_env, "SINK_PORT": str(sink_port)},
            )
        )

        # alertmanager: the stack's config, the receiver's address changed
        am_port = free_port()
        am_dir = tmp_path / "alertmanager"
        am_dir.mkdir()
        am_config = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
        for receiver in am_config["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                hook["url"] = hook["url"].replace("alert-sink:9095", f"127.0.0.1:{sink_port}")
        (am_dir / "alertmanager.yml").write_text(yaml.safe_dump(am_config))
        am_args = [a for a in SERVICES["alertmanager"]["command"] if "config.file" not in a]
        am_args = [a for a in am_args if "storage.path" not in a]
        procs.append(
            _start(
                [
                    ALERTMANAGER,
                    f"--config.file={am_dir / 'alertmanager.yml'}",
                    f"--storage.path={am_dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    *am_args,
                ],
                tmp_path / "alertmanager.log",
            )
        )
        _ready(
            f"http://127.0.0.1:{am_port}/-/ready",
            procs[-1],
            tmp_path / "alertmanager.log",
            "alertmanager",
        )

        # privgw: the service's environment; addresses and test timings changed
        metrics_port = free_port()
        env = {
            **base_env,
            **env_spec,
            "PRIVGW_BOOTSTRAP": broker.bootstrap,
            "PRIVGW_STATE_DIR": str(tmp_path / "state"),
            "PRIVGW_METRICS_HOST": "127.0.0.1",
            "PRIVGW_METRICS_PORT": str(metrics_port),
            "PRIVGW_SECRET_FILE": str(secret),
            "PRIVGW_SESSION_TIMEOUT_MS": "3000",
            "PRIVGW_HEARTBEAT_INTERVAL_MS": "500",
            "PRIVGW_STALL_TIMEOUT_SECONDS": "4",
        }
        command = [c.replace("/app/", f"{ROOT}/") for c in svc["command"]]
        worker_log = tmp_path / "privgw.log"
        procs.append(_start([sys.executable, "-m", "gateway", *command], worker_log, env))
        worker = procs[-1]
        _ready(f"http://127.0.0.1:{metrics_port}/readyz", worker, worker_log, "privgw")

        # prometheus: the stack's config and rules, targets on this machine
        prom_port = free_port()
        prom_dir = tmp_path / "prometheus"
        prom_dir.mkdir()
        config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        swap = {
            "privgw:9464": f"127.0.0.1:{metrics_port}",
            "localhost:9090": f"127.0.0.1:{prom_port}",
            "alertmanager:9093": f"127.0.0.1:{am_port}",
        }
        for section in config["scrape_configs"] + config["alerting"]["alertmanagers"]:
            for sc in section["static_configs"]:
                sc["targets"] = [swap[t] for t in sc["targets"]]
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if rule["alert"] == ALERT:
                    rule["for"] = "0s"
        (prom_dir / "alerts.yml").write_text(yaml.safe_dump(rules))
        prom_args = [
            a
            for a in SERVICES["prometheus"]["command"]
            if not a.startswith(("--config.file", "--storage.tsdb.path"))
        ]
        procs.append(
            _start(
                [
                    PROMETHEUS,
                    f"--config.file={prom_dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={prom_dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    *prom_args,
                ],
                tmp_path / "prometheus.log",
            )
        )
        prom = f"http://127.0.0.1:{prom_port}"
        _ready(f"{prom}/-/ready", procs[-1], tmp_path / "prometheus.log", "prometheus")

        # simulator: the service's command, scaled down
        sim = SERVICES["simulator"]["command"]
        sim = [
            *sim[: sim.index("--rate")],
            "--rate",
            "5000/s",
            "--waves",
            "3",  # the shipped panel policy publishes a wave once the next one has arrived
            "--respondents",
            "300",
        ]
        subprocess.run(
            [sys.executable, "-m", "gateway", *sim],
            env={**base_env, "PRIVGW_BOOTSTRAP": broker.bootstrap},
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=120,
        )
        deadline = time.monotonic() + 60
        while not _query(prom, "privgw_records_published_total >= 600"):
            assert worker.poll() is None, worker_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "Prometheus never saw the records published"
            time.sleep(0.5)
        assert _query(prom, 'up{job="privgw"} == 1')
        assert not _query(prom, 'ALERTS{alertstate="firing"}'), "nothing fires while healthy"
        assert not sink_log.read_text().strip()

        # the broker goes: fired, routed, received
        broker.stop()
        t0 = time.monotonic()
        deadline = t0 + 90
        notes: list[dict[str, Any]] = []
        while True:
            for line in sink_log.read_text().splitlines():
                if line.startswith("{"):
                    notes.append(json.loads(line))
            firing = [
                a
                for n in notes
                for a in n["alerts"]
                if a["labels"]["alertname"] == ALERT and a["status"] == "firing"
            ]
            if firing:
                break
            assert procs[0].poll() is None, "the receiver exited"
            assert time.monotonic() < deadline, (
                f"no {ALERT} notification; firing in Prometheus: "
                f"{_query(prom, 'ALERTS')}; sink: {sink_log.read_text()[-1000:]}"
            )
            notes.clear()
            time.sleep(0.5)
        took = time.monotonic() - t0
        alert = firing[0]
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["runbook_url"] == "docs/operating.md#privgwbrokerunreachable"
        assert alert["labels"]["instance"] == f"127.0.0.1:{metrics_port}"
        print(f"{ALERT} received by the webhook {took:.1f} s after the broker stopped")
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        broker.stop()
