"""Logging in to the web process through its login form, the way a browser does (a fresh
cookie jar, the CSRF token from the form, redirects not followed), and what the answer
says."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request

THROTTLED = "Too many failed logins for this account or from this address"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def log_in(base: str, username: str, password: str, forwarded: str,
           path: str = "/accounts/login/", *handlers: urllib.request.BaseHandler) -> str:
    """One try from a fresh browser: "in", "throttled" or "refused"."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(jar), NoRedirect, *handlers)
    headers = {"X-Forwarded-For": forwarded}
    form = opener.open(urllib.request.Request(base + path, headers=headers), timeout=10)
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.read().decode())
    assert csrf is not None
    data = urllib.parse.urlencode({"username": username, "password": password,
                                   "csrfmiddlewaretoken": csrf.group(1)}).encode()
    try:
        answer = opener.open(urllib.request.Request(
            base + path, data=data, headers={**headers, "Origin": base}), timeout=10)
    except urllib.error.HTTPError as redirected:
        assert redirected.code == 302, redirected.code
        return "in"
    page = answer.read().decode()
    return "throttled" if THROTTLED in page else "refused"
