#!/usr/bin/env bash
# The Debian packages asrdist uses, installed with apt-get when missing and run as root; run as
# another user, it says what to install.
# Needed (exit 1 without them): espeak-ng and its C library (the built-in corpus), flite (the
# unseen-synthesizer test set), iproute2 (network namespaces + tc for the emulated cluster).
# Optional (a note, and it goes on): flac (decodes the AN4 recordings of docs/an4.md; the AN4 test
# is skipped without it), chromium (the test that renders `asrdist compare`'s HTML report in a
# headless browser is skipped without it).
set -euo pipefail
needed=()
optional=()
why=()
command -v espeak-ng >/dev/null 2>&1 || needed+=(espeak-ng)
ldconfig -p 2>/dev/null | grep -q 'libespeak-ng.so' || needed+=(libespeak-ng1)
command -v flite >/dev/null 2>&1 || needed+=(flite)
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || needed+=(iproute2)
if ! command -v flac >/dev/null 2>&1; then
    optional+=(flac)
    why+=("flac: the AN4 recordings (docs/an4.md) cannot be decoded and the AN4 test is skipped")
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    optional+=(chromium)
    why+=("chromium: the test that renders the comparison report in a browser is skipped")
fi
[ ${#needed[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    for line in "${why[@]}"; do
        echo "asrdist: note: optional Debian package missing: $line (install: sudo apt-get install ${line%%:*})" >&2
    done
    if [ ${#needed[@]} -ne 0 ]; then
        echo "asrdist: missing Debian packages: ${needed[*]}; install them with: sudo apt-get install ${needed[*]}" >&2
        exit 1
    fi
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "asrdist: installing Debian packages: ${needed[*]} ${optional[*]}"
apt-get update -qq
if [ ${#needed[@]} -ne 0 ]; then
    apt-get install -y -qq "${needed[@]}" >/dev/null
fi
for i in "${!optional[@]}"; do
    if ! apt-get install -y -qq "${optional[$i]}" >/dev/null; then
        echo "asrdist: note: could not install ${optional[$i]}; ${why[$i]#*: }" >&2
    fi
done
