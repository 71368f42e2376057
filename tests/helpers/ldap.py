"""A real OpenLDAP server (Debian's ``slapd``) for the directory tests: one per test session,
started on free ports with its own configuration, database and self-signed certificate, and
the directory an enterprise would have: people (one disabled), groups, one of them nested.

    ldap://127.0.0.1:<port>   plain and StartTLS
    ldaps://127.0.0.1:<port>  TLS from the first byte

``Directory.add``, ``modify`` and ``delete`` change it as the directory's administrators do
(as its root DN), so that a test can disable someone or take them out of a group."""

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import ldap
import ldap.modlist

SLAPD = shutil.which("slapd") or "/usr/sbin/slapd"
SUFFIX = "dc=example,dc=com"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PASSWORD = "root-secret"
# The platform's own account: it searches for people and groups (search-then-bind, sync).
READER_DN = f"cn=platform,ou=services,{SUFFIX}"
READER_PASSWORD = "reader-secret"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
PASSWORD = "directory-pass-1"

CONFIG = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {dir}/slapd.pid
TLSCertificateFile {dir}/server.crt
TLSCertificateKeyFile {dir}/server.key
database mdb
suffix "{suffix}"
rootdn "{root_dn}"
rootpw {root_password}
directory {dir}/db
maxsize 104857600
access to attrs=userPassword by self write by anonymous auth by * none
access to * by users read by * none
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def person(uid: str, name: str, **extra: str) -> tuple[str, dict]:
    """A person as ``inetOrgPerson``: ``name`` is the Chinese full name (cn, displayName),
    its first character the surname (sn), the rest the given name."""
    return f"uid={uid},{PEOPLE}", {
        "objectClass": ["inetOrgPerson"],
        "uid": [uid],
        "cn": [name],
        "sn": [name[0]],
        "givenName": [name[1:]],
        "displayName": [name],
        "mail": [f"{uid}@example.com"],
        "userPassword": [PASSWORD],
        **{k: [v] for k, v in extra.items()},
    }


def group(name: str, *members: str) -> tuple[str, dict]:
    """A ``groupOfNames`` of people (uids) and groups (``cn=…`` names of groups)."""
    dns = [f"{m},{GROUPS}" if m.startswith("cn=") else f"uid={m},{PEOPLE}" for m in members]
    return f"cn={name},{GROUPS}", {"objectClass": ["groupOfNames"], "cn": [name], "member": dns}


# The enterprise's directory: 张伟 engineers NLP, 李娜 leads it (owners), 王芳 is a contractor
# labeling for it (contractors ⊂ annotators: a nested group), 赵磊 has left (disabled), 陈静 runs
# the site. The platform maps groups to teams in each test's settings.
ENTRIES = [
    (f"ou=people,{SUFFIX}", {"objectClass": ["organizationalUnit"], "ou": ["people"]}),
    (f"ou=groups,{SUFFIX}", {"objectClass": ["organizationalUnit"], "ou": ["groups"]}),
    (f"ou=services,{SUFFIX}", {"objectClass": ["organizationalUnit"], "ou": ["services"]}),
    (
        READER_DN,
        {
            "objectClass": ["organizationalRole", "simpleSecurityObject"],
            "cn": ["platform"],
            "userPassword": [READER_PASSWORD],
        },
    ),
    person("zhangwei", "张伟"),
    person("lina", "李娜"),
    person("wangfang", "王芳"),
    person("zhaolei", "赵磊", employeeType="disabled"),
    person("chenjing", "陈静"),
    group("nlp-engineers", "zhangwei", "zhaolei"),
    group("nlp-leads", "lina"),
    group("contractors", "wangfang"),
    group("annotators", "cn=contractors"),
    group("platform-admins", "chenjing"),
]


class Directory:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="slapd-"))
        self.port, self.tls_port = _free_port(), _free_port()
        self.url = f"ldap://127.0.0.1:{self.port}"
        self.tls_url = f"ldaps://127.0.0.1:{self.tls_port}"
        self.ca_file = self.dir / "server.crt"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Directory":
        (self.dir / "db").mkdir()
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-keyout", str(self.dir / "server.key"), "-out", str(self.ca_file),
                "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        (self.dir / "slapd.conf").write_text(
            CONFIG.format(dir=self.dir, suffix=SUFFIX, root_dn=ROOT_DN, root_password=ROOT_PASSWORD)
        )
        # -d: in the foreground (a child the test session stops), logging nothing but errors.
        self.proc = subprocess.Popen(
            [SLAPD, "-f", str(self.dir / "slapd.conf"), "-h", f"{self.url}/ {self.tls_url}/",
             "-d", "0"],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "slapd.log", "wb"),
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                self.add(
                    SUFFIX,
                    {"objectClass": ["dcObject", "organization"], "dc": ["example"], "o": ["例"]},
                )
                break
            except ldap.SERVER_DOWN:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "slapd.log").read_text(errors="replace")
                    raise RuntimeError(f"slapd did not start: {log[-2000:]}") from None
                time.sleep(0.1)
        for dn, attrs in ENTRIES:
            self.add(dn, attrs)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _admin(self):
        conn = ldap.initialize(self.url)
        conn.simple_bind_s(ROOT_DN, ROOT_PASSWORD)
        return conn

    @staticmethod
    def _encoded(attrs: dict) -> dict[str, list[bytes]]:
        return {k: [v.encode() for v in values] for k, values in attrs.items()}

    def add(self, dn: str, attrs: dict) -> None:
        conn = self._admin()
        try:
            conn.add_s(dn, ldap.modlist.addModlist(self._encoded(attrs)))
        finally:
            conn.unbind_s()

    def replace(self, dn: str, attribute: str, values: list[str]) -> None:
        conn = self._admin()
        try:
            conn.modify_s(dn, [(ldap.MOD_REPLACE, attribute, [v.encode() for v in values])])
        finally:
            conn.unbind_s()

    def add_member(self, group_name: str, uid: str) -> None:
        self._modify(f"cn={group_name},{GROUPS}", ldap.MOD_ADD, "member", f"uid={uid},{PEOPLE}")

    def remove_member(self, group_name: str, uid: str) -> None:
        self._modify(f"cn={group_name},{GROUPS}", ldap.MOD_DELETE, "member", f"uid={uid},{PEOPLE}")

    def _modify(self, dn: str, op: int, attribute: str, value: str) -> None:
        conn = self._admin()
        try:
            conn.modify_s(dn, [(op, attribute, [value.encode()])])
        finally:
            conn.unbind_s()

    def delete(self, dn: str) -> None:
        conn = self._admin()
        try:
            conn.delete_s(dn)
        finally:
            conn.unbind_s()
