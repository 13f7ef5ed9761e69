#!/usr/bin/env bash
# Make this Debian machine a sparkserve controller and lab host:
# Debian packages (Docker engine, debootstrap, ssh client), a running
# dockerd, and the pinned Python packages in .venv. Safe to run again:
# it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dockerd >/dev/null || need_apt+=(docker.io)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v ssh >/dev/null || need_apt+=(openssh-client)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v make >/dev/null || need_apt+=(make)
command -v rsync >/dev/null || need_apt+=(rsync)
# promtool (make check tests the alert rules), from Debian's prometheus.
command -v promtool >/dev/null || need_apt+=(prometheus)
# mtail (pytest runs the gateway's metrics program), from Debian's mtail.
command -v mtail >/dev/null || need_apt+=(mtail)
# nginx and its JavaScript module (pytest runs the gateway on loopback).
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
[ -f /usr/lib/nginx/modules/ngx_http_js_module.so ] || need_apt+=(libnginx-mod-http-js)
# The test suite runs the sparkserve command in a real terminal.
command -v tmux >/dev/null || need_apt+=(tmux)
# The controller's Python: Debian's own where it is (built with profile-guided
# and link-time optimisation, it runs ansible's work on the controller about
# a fifth faster than an unoptimised build earlier on PATH), else python3.
python=/usr/bin/python3
[ -x "$python" ] || python=python3
"$python" -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Only promtool is wanted here: the package's own server would hold port
  # 9090, the one a tunnel to the head's Prometheus uses.
  if [[ " ${need_apt[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  # Only the binary is wanted here: the package's server would hold port 80.
  if [[ " ${need_apt[*]} " == *" nginx "* ]]; then
    if [ -d /run/systemd/system ]; then systemctl disable --now nginx >/dev/null 2>&1 || true; else nginx -s stop >/dev/null 2>&1 || true; fi
  fi
fi

if ! docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ]; then
    systemctl start docker
  else
    echo "setup: starting dockerd (log: /var/log/sparkserve-dockerd.log)"
    nohup dockerd >/var/log/sparkserve-dockerd.log 2>&1 &
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see /var/log/sparkserve-dockerd.log" >&2; exit 1; }
fi

# A .venv made from another Python is made again.
base=$("$python" -c 'import sys; print(sys.base_prefix)')
if [ -x .venv/bin/python ] && [ "$(.venv/bin/python -c 'import sys; print(sys.base_prefix)' 2>/dev/null)" != "$base" ]; then
  echo "setup: .venv was made from another Python; making it again from $python"
  rm -rf .venv
fi
want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat .venv/.requirements 2>/dev/null)" != "$want" ]; then
  echo "setup: installing the pinned Python packages into .venv"
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
  # The sparkserve command, editable: it runs this checkout's playbooks.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  echo "$want" >.venv/.requirements
fi
