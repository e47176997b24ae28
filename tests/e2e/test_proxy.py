"""The compose stack's proxy (deploy/nginx.conf with deploy/tls-certificate.sh) in front of
the web role with the stack's settings (DJANGO_HTTPS, DJANGO_TLS_PROXY, the proxy as the
one trusted proxy), as real processes: plain HTTP is only a redirect to HTTPS; over TLS
(the self-signed certificate made at the first start) the app answers with HSTS and
Secure cookies, without redirecting again; and a client's own X-Forwarded-For does not
get it past the login throttle."""

from __future__ import annotations

import http.client
import shutil
import socket
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User

from controlplane.dev.ports import free_port
from controlplane.dev.processes import ROOT, Process

from .logins import log_in
from .server import web_role

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
DEPLOY = ROOT / "deploy"


@contextmanager
def proxy(tmp_path: Path, web_port: int) -> Iterator[tuple[int, int, ssl.SSLContext]]:
    """nginx on two free loopback ports with deploy/nginx.conf, the upstream and the
    certificate's place pointed here; (http port, https port, a context trusting it)."""
    if NGINX is None or shutil.which("openssl") is None:
        pytest.skip("nginx (or openssl) is not installed here: apt-get install nginx-light")
    certs = tmp_path / "certs"
    certs.mkdir()
    subprocess.run([str(DEPLOY / "tls-certificate.sh")], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "TLS_DIR": str(certs),
                        "PUBLIC_HOST": "127.0.0.1"})
    plain, secure = free_port(), free_port()
    conf = (DEPLOY / "nginx.conf").read_text()
    for old, new in (("server web:8000;", f"server 127.0.0.1:{web_port};"),
                     ("listen 80;", f"listen 127.0.0.1:{plain};"),
                     ("listen 443 ssl;", f"listen 127.0.0.1:{secure} ssl;"),
                     ("/etc/nginx/certs/", f"{certs}/")):
        assert old in conf, old
        conf = conf.replace(old, new)
    (tmp_path / "nginx.conf").write_text(conf)
    context = ssl.create_default_context(cafile=str(certs / "tls.crt"))

    def answers() -> bool:  # with its certificate: the web role starts after it
        try:
            with socket.create_connection(("127.0.0.1", secure), timeout=1) as raw, \
                    context.wrap_socket(raw, server_hostname="127.0.0.1"):
                return True
        except OSError:
            return False

    server = Process("nginx", [
        NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
        "-e", str(tmp_path / "error.log"),
        "-g", f"daemon off; pid {tmp_path}/nginx.pid;"],
        log=tmp_path / "nginx.log", ready_check=answers)
    server.start()
    try:
        yield plain, secure, context
    finally:
        server.stop()


def test_http_redirects_and_https_reaches_the_app_with_hsts_and_secure_cookies(
    tmp_path: Path,
) -> None:
    user = User.objects.create_user("vic", password="right-pw")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    for n in range(3):
        User.objects.create_user(f"guess{n}", password="right-pw")
    web_port = free_port()
    with proxy(tmp_path, web_port) as (plain, secure, context):
        origin = f"https://127.0.0.1:{secure}"
        with web_role(
            tmp_path, port=web_port, DJANGO_HTTPS="1", DJANGO_TLS_PROXY="1",
            DJANGO_TRUSTED_PROXIES="127.0.0.1", DJANGO_CSRF_TRUSTED_ORIGINS=origin,
            LOGIN_FAILURES_PER_ADDRESS="3",
        ):
            http_conn = http.client.HTTPConnection("127.0.0.1", plain, timeout=10)
            http_conn.request("GET", "/accounts/login/?next=/")
            redirect = http_conn.getresponse()
            assert redirect.status == 301
            assert redirect.getheader("Location") == "https://127.0.0.1/accounts/login/?next=/"

            https_conn = http.client.HTTPSConnection("127.0.0.1", secure, timeout=10,
                                                     context=context)
            https_conn.request("GET", "/accounts/login/")
            page = https_conn.getresponse()
            assert page.status == 200, page.status  # not redirected to HTTPS again
            assert page.getheader("Strict-Transport-Security") == (
                "max-age=31536000; includeSubDomains; preload")
            cookies = page.getheader("Set-Cookie") or ""
            assert "csrftoken=" in cookies and "Secure" in cookies

            tls = urllib.request.HTTPSHandler(context=context)
            for n in range(3):
                assert log_in(origin, f"guess{n}", "wrong", f"10.{n}.0.1",
                              "/accounts/login/", tls) == "refused"
            # Each try named another client; nginx wrote down the one it saw.
            assert log_in(origin, "vic", "right-pw", "10.9.0.1", "/accounts/login/",
                          tls) == "throttled"
