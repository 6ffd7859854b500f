#!/usr/bin/env bash
# Makes sure redis-server, memcached and nutcracker (twemproxy) are
# installed: the store tests start real processes; and chromium, which the
# live view's browser test drives headless. Installs them with apt-get when
# possible, otherwise fails with a message that says how.
set -euo pipefail
missing=()
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
echo "ensure-servers: ${missing[*]} not found. Install them, e.g. 'sudo apt-get install -y redis-server memcached nutcracker chromium' on Debian/Ubuntu or 'brew install redis memcached twemproxy chromium' on macOS, then run 'make test' again." >&2
exit 1
