#!/usr/bin/env bash
# Install the platform from an unpacked offline bundle (make offline-bundle), with no network:
# every package comes from the bundle's wheelhouse (pip --no-index --find-links), never from an
# index, a proxy or this machine's pip configuration. Idempotent: run it again to repair, or
# with a newer bundle to upgrade.
#
#   tar -xzf model-platform-offline-<version>.tar.gz
#   sudo model-platform-offline-<version>/install.sh --prefix /opt/model-platform
#
# Without --prefix the platform is installed in the unpacked bundle itself. PYTHON chooses the
# interpreter (default python3.11; the wheels are built for CPython 3.11 on linux x86_64).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: install.sh [--prefix DIR]

  --prefix DIR   install into DIR (e.g. /opt/model-platform); default: the bundle's directory
Environment: PYTHON (default python3.11), PLATFORM_DATA_DIR (default PREFIX/var: static files).
EOF
}

die() {
  echo "install.sh: error: $*" >&2
  exit 1
}

prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ -f "$bundle/MANIFEST.json" ] \
  || die "$bundle/MANIFEST.json not found: run this script from an unpacked offline bundle (make offline-bundle builds one), not from a source checkout"
wheelhouse="$bundle/wheelhouse"
[ -d "$wheelhouse" ] \
  || die "no wheelhouse in $bundle: run the install.sh of the unpacked bundle, not of an installed copy"

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: CPython 3.11 is needed (set PYTHON)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$PYTHON is not Python 3.11: the bundle's wheels are built for CPython 3.11 (set PYTHON)"

# Nothing but the bundle: no index, no find-links, proxy or constraints from this machine's pip
# configuration or environment.
for var in $(compgen -e); do
  case "$var" in PIP_*) unset "$var" ;; esac
done
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# 1. The bundle is whole: every file's sha256 against MANIFEST.json, before anything changes.
echo "==> checking the bundle's files against MANIFEST.json"
"$PYTHON" -I - "$bundle" <<'EOF'
import hashlib, json, os, platform, sys
from pathlib import Path

root = Path(sys.argv[1])
manifest = json.loads((root / "MANIFEST.json").read_text())
# The machine: the wheels are for linux x86_64 with at least the glibc the manifest names.
target = manifest["target"]
machine = platform.machine()
if sys.platform != "linux" or machine != "x86_64":
    sys.exit(f"install.sh: error: the bundle is for linux x86_64, this is {sys.platform} {machine}")
libc = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.28"
need = target.get("min_glibc")
if need and libc.startswith("glibc "):
    have = tuple(int(p) for p in libc.split()[1].split(".")[:2])
    if have < tuple(int(p) for p in need.split(".")):
        sys.exit(f"install.sh: error: the bundle's wheels need glibc {need}, this machine has "
                 f"{libc.split()[1]}: build the bundle with --glibc {libc.split()[1]}")
files = manifest["files"]
bad = []
for rel, entry in files.items():
    path = root / rel
    if not path.is_file():
        bad.append(f"{rel}: missing")
        continue
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != entry["sha256"]:
        bad.append(f"{rel}: corrupt (sha256 {digest.hexdigest()}, expected {entry['sha256']})")
if bad:
    print(f"install.sh: error: the bundle in {root} is damaged; copy it again:", file=sys.stderr)
    for line in bad[:20]:
        print(f"  {line}", file=sys.stderr)
    if len(bad) > 20:
        print(f"  … and {len(bad) - 20} more", file=sys.stderr)
    sys.exit(1)
print(f"    {len(files)} files OK")
EOF

manifest() { # manifest KEY: a value of MANIFEST.json, as a shell word
  "$PYTHON" -I -c '
import json, sys
m = json.load(open(sys.argv[1]))
value = {"version": m["version"], "subset": int(m["subset"]), "venvs": " ".join(m["venvs"]),
         "static": int(bool(m.get("static")))}[sys.argv[2]]
print(value)' "$bundle/MANIFEST.json" "$1"
}
version="$(manifest version)"
subset="$(manifest subset)"
venvs=" $(manifest venvs) "

# 2. The source tree: in place, or copied to the prefix (files a previous bundle installed there
#    and this one no longer has, such as a removed migration, are deleted).
if [ -z "$prefix" ]; then
  root="$bundle"
else
  mkdir -p "$prefix"
  root="$(cd "$prefix" && pwd)"
fi
if [ "$root" != "$bundle" ]; then
  echo "==> copying model-platform $version to $root"
  if [ -f "$root/MANIFEST.json" ]; then
    "$PYTHON" -I - "$root/MANIFEST.json" "$bundle/MANIFEST.json" "$root" <<'EOF'
import json, sys
from pathlib import Path

old, new = (set(json.load(open(p))["files"]) for p in sys.argv[1:3])
root = Path(sys.argv[3])
for rel in sorted(old - new):
    if not rel.startswith(("wheelhouse/", "static/")):
        (root / rel).unlink(missing_ok=True)
EOF
  fi
  tar -C "$bundle" --exclude=./wheelhouse --exclude=./static --exclude='./.venv*' \
    --exclude=./var --exclude=./model_platform.egg-info -cf - . | tar -C "$root" -xf -
fi

pip_install() { # pip_install VENV ARGS...: from the wheelhouse only
  local venv="$1"
  shift
  "$venv/bin/python" -m pip install --quiet --no-index "$@"
}

make_venv() { # make_venv DIR WHEELHOUSE: a venv with the bundle's pip and the wheelhouse's pins
  if [ ! -x "$1/bin/python" ]; then
    "$PYTHON" -m venv "$1"
  fi
  pip_install "$1" --find-links "$wheelhouse/platform" --upgrade pip
  pip_install "$1" --find-links "$wheelhouse/$2" -r "$wheelhouse/$2/requirements.txt"
}

runtime_dist() { # runtime_dist VENV: runtime/ and serving/ with the backends' entry points
  pip_install "$1" --find-links "$wheelhouse/platform" --no-deps -e "$root/platform/runtime-dist"
}

# 3. The venvs of the Makefile, with the pins of their wheelhouses.
echo "==> .venv: the console, workers and Label Studio client"
make_venv "$root/.venv" platform
# The project itself, editable as `make install` does: the code runs from $root, where
# settings find var/, locale/ and the runtime venv. A test bundle holds part of the
# dependencies only.
nodeps=()
if [ "$subset" = 1 ]; then nodeps=(--no-deps); fi
pip_install "$root/.venv" --find-links "$wheelhouse/platform" \
  ${nodeps[@]+"${nodeps[@]}"} -e "$root"
runtime_dist "$root/.venv"
touch "$root/.venv/.installed"

if [[ "$venvs" == *" runtime "* ]]; then
  echo "==> .venv-runtime: the job runner and serving host (Paddle, torch)"
  make_venv "$root/.venv-runtime" runtime
  # runtime/ and serving/ only (as make runtime): no Django.
  runtime_dist "$root/.venv-runtime"
  touch "$root/.venv-runtime/.installed"
fi

if [[ "$venvs" == *" labelstudio "* ]]; then
  echo "==> .venv-labelstudio: the Label Studio server"
  make_venv "$root/.venv-labelstudio" labelstudio
  touch "$root/.venv-labelstudio/.installed"
fi

# 4. Translations, compiled with Babel as the Makefile does (no GNU gettext needed).
if [ -x "$root/.venv/bin/pybabel" ]; then
  echo "==> compiling translations"
  for po in "$root"/locale/*/LC_MESSAGES/django.po; do
    [ -e "$po" ] || continue
    "$root/.venv/bin/pybabel" -q compile -i "$po" -o "${po%.po}.mo"
  done
elif [ "$subset" = 1 ]; then
  echo "    (no Babel in this test bundle: translations not compiled)"
else
  die "pybabel missing from $root/.venv: the bundle's wheelhouse lacks Babel"
fi

# 5. The collected static files, where STATIC_ROOT points (start.sh's collectstatic then has
#    nothing left to do).
data_dir="${PLATFORM_DATA_DIR:-$root/var}"
if [ "$(manifest static)" = 1 ]; then
  echo "==> static files to $data_dir/static"
  (umask 077 && mkdir -p "$data_dir")
  mkdir -p "$data_dir/static"
  cp -R "$bundle/static/." "$data_dir/static/"
fi

cat <<EOF

model-platform $version is installed in $root (from the bundle only, no network).

Next steps:
  - One machine, by hand:   cd $root && bash platform/start.sh
    (generates the secret key, migrates, creates the first administrator, starts everything)
  - As services:            the systemd units in $root/platform/systemd/ (see its README)
  - Settings:               environment variables, see console/settings.py and README.md
                            (DATABASE_URL, REDIS_URL, PLATFORM_DATA_DIR, ALLOWED_HOSTS …)
  - The data directory      $data_dir must belong to the user the platform runs as.
  - Base models are imported from disk (PLATFORM_MODEL_IMPORT_DIR); presets need no files.
EOF
