#!/usr/bin/env bash
# Installs the Debian packages asrdist needs when they are missing: espeak-ng (and its C library),
# flite, flac (decodes the AN4 recordings in ../shared/data/an4, see docs/an4.md), iproute2
# (network namespaces + tc for the emulated cluster), chromium (the test that renders
# `asrdist compare`'s HTML report in a headless browser; skipped without it).
set -euo pipefail
missing=()
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)
ldconfig -p 2>/dev/null | grep -q 'libespeak-ng.so' || missing+=(libespeak-ng1)
command -v flite >/dev/null 2>&1 || missing+=(flite)
command -v flac >/dev/null 2>&1 || missing+=(flac)
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing+=(iproute2)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "asrdist: missing Debian packages: ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "asrdist: installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
