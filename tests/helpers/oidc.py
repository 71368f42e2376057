"""A real OpenID provider for the single sign-on tests: the certified ``oidc-provider`` (npm,
tests/oidc/, installed by ``make install-test``) in a Node.js process of its own, with the
platform registered as a client and the people below. Their claims are read from a file at
each login, so that a test can move someone between groups (``Provider.set``).

Its login page is the package's development one: any known account, any password."""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests

ROOT = Path(__file__).resolve().parents[2]
PROVIDER_DIR = ROOT / "tests" / "oidc"
NODE = shutil.which("node") or "/usr/bin/node"
CLIENT_ID = "model-platform"
CLIENT_SECRET = "client-secret-for-tests"  # a throwaway provider's

PEOPLE = {
    "sub-zhangwei": {
        "preferred_username": "zhangwei",
        "name": "张伟",
        "given_name": "伟",
        "family_name": "张",
        "email": "zhangwei@example.com",
        "groups": ["nlp-engineers"],
    },
    "sub-lina": {
        "preferred_username": "lina",
        "name": "李娜",
        "email": "lina@example.com",
        "groups": ["nlp-leads", "nlp-engineers"],
    },
    "sub-chenjing": {
        "preferred_username": "chenjing",
        "name": "陈静",
        "groups": ["platform-admins"],
    },
}


def missing() -> str:
    """Why the provider cannot run here ("" when it can)."""
    if not Path(NODE).exists():
        return "single sign-on tests need Node.js (node)"
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").exists():
        return "single sign-on tests need tests/oidc's packages (make install-test)"
    return ""


class Provider:
    def __init__(self, platform_urls: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.platform_urls = platform_urls
        self.dir = Path(tempfile.mkdtemp(prefix="oidc-"))
        self.accounts_file = self.dir / "accounts.json"
        self.people = json.loads(json.dumps(PEOPLE))
        self.proc: subprocess.Popen | None = None

    def set(self, subject: str, **claims) -> None:
        """Change a person's claims (``groups=[…]``) or add a person."""
        self.people.setdefault(subject, {}).update(claims)
        self.accounts_file.write_text(json.dumps(self.people, ensure_ascii=False))

    def start(self) -> "Provider":
        self.accounts_file.write_text(json.dumps(self.people, ensure_ascii=False))
        client = {
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "redirect_uris": [f"{u}/oidc/callback/" for u in self.platform_urls],
            "post_logout_redirect_uris": [f"{u}/login/" for u in self.platform_urls],
        }
        env = {
            **os.environ,
            "OIDC_PORT": str(self.port),
            "OIDC_CLIENT": json.dumps(client),
            "OIDC_ACCOUNTS_FILE": str(self.accounts_file),
        }
        self.proc = subprocess.Popen(
            [NODE, "provider.mjs"],
            cwd=PROVIDER_DIR,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "provider.log", "wb"),
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2)
                return self
            except requests.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "provider.log").read_text(errors="replace")
                    raise RuntimeError(
                        f"the OpenID provider did not start: {log[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def sign_in(self, authorize_url: str, subject: str, session: requests.Session) -> str:
        """What a person's browser does at the provider: from the platform's redirect to the
        provider's login page, signed in as ``subject``, to the redirect back to the platform;
        returns that last URL."""
        url = authorize_url
        while True:
            response = session.get(url, allow_redirects=False)
            if response.status_code in (302, 303):
                url = urljoin(url, response.headers["Location"])
                if urlsplit(url).netloc != urlsplit(self.issuer).netloc:
                    return url
                continue
            form = re.search(r'<form[^>]*action="([^"]+)"', response.text)
            assert form, response.text[:2000]
            data = {"prompt": "login", "login": subject, "password": "any"}
            if 'value="consent"' in response.text:
                data = {"prompt": "consent"}
            response = session.post(urljoin(url, form.group(1)), data=data, allow_redirects=False)
            url = urljoin(url, response.headers["Location"])
            if urlsplit(url).netloc != urlsplit(self.issuer).netloc:
                return url
