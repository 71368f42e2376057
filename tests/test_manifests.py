"""The operator manifests run the processes of platform/Procfile: systemd units, the compose
file, the Kubernetes manifests, and the nginx configuration in front of them.

The process list comes from the Procfile at test time, so a new process without its manifests
fails here, as does a manifest whose command drifts from its Procfile line or that sets a
variable the platform does not read.
"""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = ROOT / "platform"
SYSTEMD = PLATFORM / "systemd"
K8S = PLATFORM / "k8s"
COMPOSE = PLATFORM / "compose.yaml"
NGINX = PLATFORM / "nginx" / "model-platform.conf"
ENV_EXAMPLE = SYSTEMD / "platform.env.example"
INSTALL_DIR = "/opt/model-platform"
ENV_FILE = "/etc/model-platform/platform.env"
# Started by `make run` only when nothing is configured; a site brings its own.
EMBEDDED_ONLY = {"redis", "labelstudio"}

# ${VAR}, ${VAR:-default}, ${VAR:?message} (shell, compose, systemd), $(VAR) (Kubernetes), $VAR.
VARIABLE = re.compile(r"\$\{(\w+)(?:[:?+=-][^}]*)?\}|\$\((\w+)\)|\$([A-Za-z_]\w*)")
# Reads of the environment: os.environ.get("X"), os.environ["X"], env_bool("X"), env_list("X").
ENV_READ = re.compile(
    r"""(?:environ\.get|environ\[|getenv|env_\w+)\(?\s*["']([A-Z][A-Z0-9_]*)["']"""
)


def procfile() -> dict[str, str]:
    processes = {}
    for line in (PLATFORM / "Procfile").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _sep, command = line.partition(":")
        processes[name.strip()] = command.strip()
    return processes


def managed_processes() -> list[str]:
    return [name for name in procfile() if name not in EMBEDDED_ONLY]


def variables_in(text: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in VARIABLE.finditer(text)}


def known_variables() -> set[str]:
    """What the platform reads: console/settings.py (the console's settings), the processes'
    own entry points that run without settings (management commands, the serving host), and
    the Procfile."""
    sources = [
        ROOT / "console" / "settings.py",
        *sorted(ROOT.glob("*/management/commands/*.py")),
        *sorted((ROOT / "serving").glob("*.py")),
    ]
    names = {m[1] for path in sources for m in ENV_READ.finditer(path.read_text())}
    return names | variables_in((PLATFORM / "Procfile").read_text())


def program(token: str) -> str:
    """A program as `venv:name`: `.venv/bin/celery`, `/opt/model-platform/.venv/bin/celery` and
    `celery` (on start.sh's PATH, .venv/bin) are the same program; the runtime venv's is not."""
    match = re.search(r"(?:^|/)(\.venv(?:-runtime)?)/bin/([^/]+)$", token)
    if match:
        return f"{match[1]}:{match[2]}"
    return token if "/" in token else f".venv:{token}"


def same_command(procfile_line: str, argv: list[str]) -> str | None:
    """None when ``argv`` runs the Procfile line's program with its arguments, else why not. A
    Procfile argument with a variable (``--bind ${PLATFORM_WEB_HOST:-127.0.0.1}:...``) matches
    a value or a reference to the same variable; every other argument must be equal."""
    expected = shlex.split(procfile_line)
    if len(argv) != len(expected):
        return f"{len(argv)} arguments, the Procfile has {len(expected)}: {argv} vs {expected}"
    if program(argv[0]) != program(expected[0]):
        return f"program {argv[0]!r} is not the Procfile's {expected[0]!r}"
    for want, got in zip(expected[1:], argv[1:], strict=True):
        if not re.fullmatch(_pattern(want), got):
            return f"argument {got!r} does not match the Procfile's {want!r}"
        wanted_vars, got_vars = variables_in(want), variables_in(got)
        if got_vars and not got_vars <= wanted_vars:
            return f"argument {got!r} uses {got_vars - wanted_vars}, the Procfile {wanted_vars}"
    return None


def _pattern(token: str) -> str:
    pieces, last = [], 0
    for m in VARIABLE.finditer(token):
        pieces += [re.escape(token[last : m.start()]), ".+"]
        last = m.end()
    pieces.append(re.escape(token[last:]))
    return "".join(pieces)


# -- systemd -------------------------------------------------------------------------------------


def unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A unit file as {section: [(key, value), ...]}: keys repeat (ExecStartPre, Environment)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    text = path.read_text().replace("\\\n", " ")
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        key, _sep, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def values(sections: dict, section: str, key: str) -> list[str]:
    return [v for k, v in sections.get(section, []) if k == key]


def unit_environment(sections: dict) -> dict[str, str]:
    env = {}
    for value in values(sections, "Service", "Environment"):
        for item in shlex.split(value):
            name, _sep, val = item.partition("=")
            env[name] = val
    return env


def exec_argv(value: str) -> list[str]:
    # Prefixes of systemd (-@:+!), then its specifiers: %% is a literal %.
    argv = shlex.split(value.lstrip("-@:+!"))
    return [arg.replace("%%", "%") for arg in argv]


def seconds(value: str) -> float:
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    return sum(
        float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value.lower())
    )


@pytest.mark.parametrize("name", managed_processes())
def test_systemd_unit_runs_the_procfile_command(name):
    path = SYSTEMD / f"platform-{name}.service"
    assert path.exists(), f"no systemd unit for the Procfile's {name!r}: {path}"
    sections = unit(path)
    (exec_start,) = values(sections, "Service", "ExecStart")
    argv = exec_argv(exec_start)
    assert argv[0].startswith(f"{INSTALL_DIR}/.venv"), f"{argv[0]}: not a venv of {INSTALL_DIR}"
    problem = same_command(procfile()[name], argv)
    assert problem is None, f"{path.name}: {problem}"

    assert values(sections, "Service", "WorkingDirectory") == [INSTALL_DIR]
    assert values(sections, "Service", "EnvironmentFile") == [ENV_FILE]
    (user,) = values(sections, "Service", "User")
    # Root only where it starts sandboxed processes as PLATFORM_RUNNER_USER (see below).
    assert user and (user != "root" or name in SWITCHES_USER)
    assert values(sections, "Service", "Restart") == ["on-failure"]
    assert values(sections, "Service", "KillMode") in (["mixed"], ["control-group"])
    assert "platform.target" in values(sections, "Install", "WantedBy")
    assert "platform.target" in values(sections, "Unit", "PartOf")
    # systemd has no ${VAR:-default}: the unit sets the Procfile's defaults itself.
    defaults = unit_environment(sections)
    for variable in variables_in(exec_start):
        assert variable in defaults, f"{path.name}: ${{{variable}}} has no Environment= default"
    for m in re.finditer(r"\$\{(\w+):-([^}]*)\}", procfile()[name]):
        assert defaults.get(m[1]) == m[2], f"{path.name}: {m[1]} defaults to {m[2]!r} there"


# The processes that start sandboxed children (runners, predictors) as PLATFORM_RUNNER_USER.
SWITCHES_USER = {"train", "serve"}
# All that they may keep of root's capabilities (runtime/sandbox.py says why).
SWITCH_CAPABILITIES = {"SETUID", "SETGID", "CHOWN", "FOWNER", "DAC_OVERRIDE", "DAC_READ_SEARCH"}
SWITCH_CAPABILITIES |= {"KILL"}


@pytest.mark.parametrize("name", managed_processes())
def test_systemd_units_are_hardened(name):
    sections = unit(SYSTEMD / f"platform-{name}.service")
    service = dict(sections["Service"])
    for key, value in {
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
    }.items():
        assert service.get(key) == value, f"platform-{name}.service: {key}={service.get(key)}"
    assert "/var/lib/model-platform" in values(sections, "Service", "ReadWritePaths")
    (caps,) = values(sections, "Service", "CapabilityBoundingSet")
    kept = {c.removeprefix("CAP_") for c in caps.split()}
    if service["User"] == "root":
        assert name in SWITCHES_USER and kept and kept <= SWITCH_CAPABILITIES, (name, kept)
        assert service.get("Group") not in (None, "root")
    else:
        assert kept == set(), f"platform-{name}.service keeps capabilities {kept}"


def test_k8s_pods_are_hardened():
    for deployment in of_kind("Deployment"):
        name = deployment["metadata"]["name"]
        pod = deployment["spec"]["template"]["spec"]
        switches = name.split("-")[0] in SWITCHES_USER
        for container in pod_containers(deployment):
            where = f"{name}/{container['name']}"
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            added = set(context["capabilities"].get("add", []))
            if switches:
                assert added <= SWITCH_CAPABILITIES, where
                assert pod["securityContext"]["runAsGroup"] != 0, where
            else:
                assert not added, where
                assert context["readOnlyRootFilesystem"] is True, where
                assert pod["securityContext"]["runAsNonRoot"] is True, where
                mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
                assert "/tmp" in mounts, f"{where}: a read-only root needs a /tmp volume"  # noqa: S108


def test_the_train_unit_gives_jobs_back_on_stop():
    sections = unit(SYSTEMD / "platform-train.service")
    # SIGTERM to the worker only (jobs are child process groups), then time to hand them back.
    assert values(sections, "Service", "KillMode") == ["mixed"]
    (timeout,) = values(sections, "Service", "TimeoutStopSec")
    assert seconds(timeout) >= 300


def test_platform_target_groups_the_units():
    assert (SYSTEMD / "platform.target").exists()
    units = {p.name for p in SYSTEMD.glob("platform-*.service")}
    assert units == {f"platform-{name}.service" for name in managed_processes()}


def test_env_example_documents_the_processes_environment():
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M))
    unknown = documented - known_variables()
    assert not unknown, f"platform.env.example names variables nothing reads: {sorted(unknown)}"
    used = {v for name in managed_processes() for v in variables_in(procfile()[name])}
    used |= {
        v
        for path in SYSTEMD.glob("*.service")
        for value in values(unit(path), "Service", "ExecStart")
        for v in variables_in(value)
    }
    assert used <= documented, f"not in platform.env.example: {sorted(used - documented)}"
    # What a production node cannot do without (set, not only shown).
    active = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M))
    required = {"SECRET_KEY", "SERVING_SECRET", "DATABASE_URL", "REDIS_URL", "PLATFORM_DATA_DIR"}
    required |= {"ALLOWED_HOSTS", "SERVING_HOSTS", "SERVING_PUBLIC_URL", "LABEL_STUDIO_URL"}
    assert required <= active, f"not set in platform.env.example: {sorted(required - active)}"
    # Object storage is documented with all the names settings.py reads for it.
    settings_text = (ROOT / "console" / "settings.py").read_text()
    storage = set(re.findall(r"\"(AWS_\w+)\"", settings_text)) | {"STORAGE_BACKEND"}
    assert storage <= documented


def test_systemd_variables_are_known():
    known = known_variables()
    for path in SYSTEMD.glob("*.service"):
        sections = unit(path)
        names = set(unit_environment(sections))
        for key in ("ExecStart", "ExecStartPre"):
            for value in values(sections, "Service", key):
                names |= variables_in(value)
        assert names <= known, f"{path.name}: unknown variables {sorted(names - known)}"


def test_systemd_analyze_verify(tmp_path):
    """systemd's own check of the units, where systemd-analyze exists: the install directory
    is pointed at this checkout, whose venvs hold the programs."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    for venv in (".venv", ".venv-runtime"):
        if not (ROOT / venv / "bin" / "python").exists():
            pytest.skip(f"{venv} is not installed: the units' programs are missing")
    for path in SYSTEMD.iterdir():
        if path.suffix in {".service", ".target"}:
            (tmp_path / path.name).write_text(path.read_text().replace(INSTALL_DIR, str(ROOT)))
    units = sorted(str(p) for p in tmp_path.iterdir())
    done = subprocess.run(
        [analyze, "verify", "--man=no", *units],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    ours = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if any(Path(u).name in line for u in units) and "EnvironmentFile" not in line
    ]
    assert not ours, "\n".join(ours)


# -- compose -------------------------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def platform_services(doc: dict) -> dict[str, dict]:
    image = doc["x-platform"]["image"]
    return {name: s for name, s in doc["services"].items() if s.get("image") == image}


def compose_argv(command) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    return [arg.replace("$$", "$") for arg in argv]


@pytest.mark.parametrize("name", managed_processes())
def test_compose_service_runs_the_procfile_command(name):
    doc = compose()
    services = platform_services(doc)
    assert name in services, f"no compose service of the platform image for {name!r}"
    problem = same_command(procfile()[name], compose_argv(services[name]["command"]))
    assert problem is None, f"compose service {name}: {problem}"
    env = services[name]["environment"]
    assert "/var/lib/model-platform" in " ".join(services[name]["volumes"])
    assert env["PLATFORM_DATA_DIR"] == "/var/lib/model-platform"


def test_compose_has_the_services_of_a_site():
    doc = compose()
    services = doc["services"]
    for name in ("postgres", "redis", "minio", "labelstudio"):
        assert name in services
    assert services["labelstudio"].get("profiles") == ["labelstudio"]
    assert "--appendonly" in services["redis"]["command"]
    assert services["redis"]["command"][services["redis"]["command"].index("--appendonly") + 1]
    assert doc["x-platform"]["build"]["dockerfile"] == "platform/Dockerfile"
    assert (COMPOSE.parent / doc["x-platform"]["build"]["context"] / "manage.py").exists()
    env = doc["x-platform"]["environment"]
    assert env["STORAGE_BACKEND"] == "s3"
    assert env["AWS_S3_ENDPOINT_URL"].startswith("http://minio:")
    assert env["REDIS_URL"].startswith("redis://redis:")
    assert "@postgres:" in env["DATABASE_URL"]


def test_compose_variables_are_known():
    """The platform's containers get only variables the platform reads; the file's own
    ${...} are those or the variables of the images it configures (POSTGRES_PASSWORD…)."""
    doc = compose()
    known = known_variables()
    platform = platform_services(doc)
    for name, service in platform.items():
        names = set(service.get("environment", {}))
        assert names <= known, f"compose {name}: unknown variables {sorted(names - known)}"
    images_own = {
        key
        for name, service in doc["services"].items()
        if name not in platform
        for key in service.get("environment", {})
    }
    lines = COMPOSE.read_text().splitlines()
    text = "\n".join(line.split(" #")[0] for line in lines if not line.lstrip().startswith("#"))
    referenced = variables_in(text.replace("$$", ""))
    assert referenced <= known | images_own, sorted(referenced - known - images_own)


def test_dockerfile_makes_both_venvs():
    text = (PLATFORM / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert "make install" in text
    assert f"WORKDIR {INSTALL_DIR}" in text
    # Everything `make install` needs is copied in.
    copied = set(re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M))
    sources = {src for line in copied for src in line.split()}
    for needed in ("pyproject.toml", "Makefile", "manage.py", "platform/", "locale/"):
        assert needed in sources, f"the Dockerfile does not copy {needed}"
    for package in ("console", "labeling", "training", "deployment"):
        assert f"{package}/" in sources


# -- Kubernetes ----------------------------------------------------------------------------------


def k8s_documents() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.y*ml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def of_kind(kind: str) -> list[dict]:
    return [d for d in k8s_documents() if d["kind"] == kind]


def deployments_for(name: str) -> list[dict]:
    return [
        d
        for d in of_kind("Deployment")
        if d["metadata"]["name"] == name or d["metadata"]["name"].startswith(f"{name}-")
    ]


def pod_containers(deployment: dict) -> list[dict]:
    spec = deployment["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_k8s_documents_parse_and_share_a_namespace():
    docs = k8s_documents()
    assert all({"apiVersion", "kind", "metadata"} <= set(d) for d in docs)
    (namespace,) = of_kind("Namespace")
    name = namespace["metadata"]["name"]
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == name, doc["metadata"]["name"]
    (claim,) = of_kind("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert len(of_kind("ConfigMap")) == 1
    (secret,) = of_kind("Secret")
    for key in ("SECRET_KEY", "SERVING_SECRET", "DATABASE_URL", "REDIS_URL"):
        assert key in secret.get("stringData", secret.get("data", {}))


@pytest.mark.parametrize("name", managed_processes())
def test_k8s_deployment_runs_the_procfile_command(name):
    found = deployments_for(name)
    assert found, f"no Kubernetes Deployment for the Procfile's {name!r}"
    for deployment in found:
        container = next(
            (c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name),
            None,
        )
        assert container is not None, f"{deployment['metadata']['name']}: no container {name!r}"
        argv = [*container.get("command", []), *container.get("args", [])]
        problem = same_command(procfile()[name], [str(a) for a in argv])
        assert problem is None, f"Deployment {deployment['metadata']['name']}: {problem}"


def test_k8s_deployments_get_config_secret_and_data():
    (config,) = of_kind("ConfigMap")
    (secret,) = of_kind("Secret")
    (claim,) = of_kind("PersistentVolumeClaim")
    data_dir = config["data"]["PLATFORM_DATA_DIR"]
    defined = set(config["data"]) | set(secret.get("stringData", secret.get("data", {})))
    known = known_variables()
    assert defined <= known, f"unknown variables: {sorted(defined - known)}"
    deployments = of_kind("Deployment")
    assert deployments
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        spec = deployment["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), name
        pod = spec["template"]["spec"]
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod.get("volumes", [])
            if "persistentVolumeClaim" in v
        }
        assert claims, f"{name}: no data volume"
        for container in pod_containers(deployment):
            where = f"{name}/{container['name']}"
            refs = container.get("envFrom", [])
            config_refs = [r["configMapRef"]["name"] for r in refs if "configMapRef" in r]
            secret_refs = [r["secretRef"]["name"] for r in refs if "secretRef" in r]
            assert config_refs == [config["metadata"]["name"]], where
            assert secret_refs == [secret["metadata"]["name"]], where
            env = {e["name"] for e in container.get("env", [])}
            assert env <= known, f"{where}: unknown variables {sorted(env - known)}"
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert claims.get(mounts.get(data_dir)) == claim["metadata"]["name"], where
            # $(VAR) of a command is only expanded when the container has VAR.
            argv = " ".join(
                str(a) for a in [*container.get("command", []), *container.get("args", [])]
            )
            missing = variables_in(argv) - defined - env
            assert not missing, f"{where}: $({missing.pop()}) is not in its environment"
            assert "image" in container


@pytest.mark.parametrize("process", ["web", "worker", "beat"])
def test_k8s_singletons_recreate(process):
    for deployment in deployments_for(process):
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize("process", ["web", "serve"])
def test_k8s_services_reach_their_deployments(process):
    services = [s for s in of_kind("Service") if s["metadata"]["name"] == process]
    assert services, f"no Service {process!r}"
    (service,) = services
    selector = service["spec"]["selector"]
    targets = [
        d
        for d in of_kind("Deployment")
        if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert [d["metadata"]["name"] for d in targets] == [process]
    ports = {
        p.get("name"): p["containerPort"]
        for c in targets[0]["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
    }
    for port in service["spec"]["ports"]:
        target = port["targetPort"]
        assert target in ports or target in ports.values()
    if process == "serve":
        # The reconciler calls each serving host by its URL: one pod behind each Service.
        assert targets[0]["spec"]["replicas"] == 1
        (config,) = of_kind("ConfigMap")
        assert f"http://{process}:{service['spec']['ports'][0]['port']}" in config["data"][
            "SERVING_HOSTS"
        ].split(",")


def test_k8s_train_notes_accelerator_nodes():
    text = "\n".join(p.read_text() for p in K8S.glob("*.y*ml"))
    assert "nodeSelector" in text
    assert "nvidia.com/gpu" in text
    assert "huawei.com/Ascend910" in text


# -- nginx ---------------------------------------------------------------------------------------


def nginx_blocks(text: str) -> list:
    """The configuration as a tree: [(directive words, children or None)]; raises on unbalanced
    braces or a directive without its semicolon."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[{};]|[^\s{};"\']+', _strip_comments(text))
    stack: list[list] = [[]]
    words: list[str] = []
    for token in tokens:
        if token == "{":
            block: list = []
            stack[-1].append((words, block))
            stack.append(block)
            words = []
        elif token == "}":
            assert not words, f"no semicolon after {words}"
            assert len(stack) > 1, "a } closes nothing"
            stack.pop()
        elif token == ";":
            stack[-1].append((words, None))
            words = []
        else:
            words.append(token)
    assert len(stack) == 1, "a { is never closed"
    assert not words, f"no semicolon after {words}"
    return stack[0]


def _strip_comments(text: str) -> str:
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())


def walk(blocks, path=()):
    for words, children in blocks:
        yield path, words, children
        if children is not None:
            yield from walk(children, (*path, words))


def directives(block, name: str) -> list[list[str]]:
    return [words[1:] for words, children in block if children is None and words[0] == name]


def test_nginx_terminates_tls_in_front_of_web_and_serve():
    tree = nginx_blocks(NGINX.read_text())
    upstreams = {words[1]: children for words, children in tree if words[0] == "upstream"}
    assert len(upstreams) >= 2
    servers = [children for words, children in tree if words == ["server"]]
    tls = [s for s in servers if any("ssl" in d for d in directives(s, "listen"))]
    assert tls, "no server listens with ssl"
    for server in tls:
        assert directives(server, "ssl_certificate"), "a TLS server without ssl_certificate"
        assert directives(server, "ssl_certificate_key")
        headers = [d[0] for d in directives(server, "add_header")]
        assert "Strict-Transport-Security" in headers
        forwarded = dict(d[:2] for d in directives(server, "proxy_set_header"))
        assert forwarded.get("X-Forwarded-Proto") in ("https", "$scheme")
    proxied = {
        words[1].removeprefix("http://").removeprefix("https://")
        for _path, words, children in walk(tree)
        if children is None and words[0] == "proxy_pass"
    }
    assert set(upstreams) <= proxied, f"upstreams never proxied to: {set(upstreams) - proxied}"
    # The web upstream points at the Procfile's default bind, the serve one at the serving port.
    servers_of = {
        name: " ".join(" ".join(w) for w, _c in block) for name, block in upstreams.items()
    }
    assert any(":8000" in s for s in servers_of.values())
    assert any(":8300" in s for s in servers_of.values())


def test_nginx_streams_chat_completions_and_takes_uploads():
    tree = nginx_blocks(NGINX.read_text())
    chat = [
        children
        for _path, words, children in walk(tree)
        if words[0] == "location" and "/v1/chat/completions" in words[-1] and children is not None
    ]
    assert chat, "no location for /v1/chat/completions"
    for block in chat:
        assert ["off"] in directives(block, "proxy_buffering")
        (timeout,) = directives(block, "proxy_read_timeout")
        assert seconds(timeout[0]) >= 600
    settings_text = (ROOT / "console" / "settings.py").read_text()
    upload_mb = re.search(r'"PLATFORM_UPLOAD_MAX_MB",\s*"?(\d+)', settings_text)[1]
    sizes = [
        words[1]
        for _path, words, children in walk(tree)
        if children is None and words[0] == "client_max_body_size"
    ]
    assert f"{upload_mb}m" in sizes, f"client_max_body_size {upload_mb}m (PLATFORM_UPLOAD_MAX_MB)"


def test_nginx_accepts_the_configuration(tmp_path):
    """nginx's own check, where nginx and openssl exist: a throwaway certificate in place of
    the site's."""
    nginx, openssl = shutil.which("nginx"), shutil.which("openssl")
    if nginx is None or openssl is None:
        pytest.skip("nginx or openssl is not installed")
    key, cert = tmp_path / "platform.key", tmp_path / "platform.crt"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    subprocess.run(
        [openssl, *request, "-subj", "/CN=x", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    site = NGINX.read_text().replace("/etc/model-platform/tls", str(tmp_path))
    (tmp_path / "site.conf").write_text(site)
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n  access_log off;\n  include {tmp_path}/site.conf;\n}}\n"
    )
    done = subprocess.run(
        [nginx, "-t", "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_k8s_web_is_reached_by_the_ingress_controller_only():
    """X-Forwarded-For is believed from PLATFORM_TRUSTED_PROXIES (the pod network): a pod that
    runs user code must not reach `web` directly and choose its client address."""
    (config,) = of_kind("ConfigMap")
    assert config["data"].get("PLATFORM_TRUSTED_PROXIES")
    (web,) = deployments_for("web")
    labels = web["spec"]["template"]["metadata"]["labels"]
    policies = [
        p
        for p in of_kind("NetworkPolicy")
        if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        and "Ingress" in p["spec"]["policyTypes"]
    ]
    assert policies, "no NetworkPolicy limits who reaches web"
    for policy in policies:
        for rule in policy["spec"]["ingress"]:
            assert rule.get("from"), "a rule that admits every pod"
            assert all("namespaceSelector" in peer for peer in rule["from"]), rule
