#!/usr/bin/env bash
# Install Debian's Nsight Systems (2022.4, non-free) into a private prefix without touching the
# system's apt setup. `apt-get install nsight-systems` fails on machines without the NVIDIA driver
# (it depends on libcuda1), so we download the two .debs and unpack them. docs/testing.md says what
# it does step by step. Prints the path of the nsys binary on its last line.
set -euo pipefail

prefix=${NSYSAN_NSYS_PREFIX:-$HOME/.cache/nsysan/nsys}
nsys_bin=$prefix/usr/bin/nsys
if [ -x "$nsys_bin" ] && "$nsys_bin" --version >/dev/null 2>&1; then
    echo "$nsys_bin"
    exit 0
fi

sources=/etc/apt/sources.list.d/debian.sources
[ -r "$sources" ] || { echo "install-nsys: $sources not found; cannot derive a non-free entry" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/debs"

# Reuse the URIs and keyring of the system's main Debian stanza (the one whose suite is plain
# "bookworm"); only the component changes. No registry host is written down here.
awk -v RS= '/Suites:[^\n]*bookworm( |\n|$)/ && !done {
    n = split($0, lines, "\n")
    for (i = 1; i <= n; i++) {
        if (lines[i] ~ /^#/) continue
        if (lines[i] ~ /^Suites:/) { print "Suites: bookworm"; continue }
        if (lines[i] ~ /^Components:/) { print "Components: non-free"; continue }
        print lines[i]
    }
    done = 1
}' "$sources" > "$work/nonfree.sources"
grep -q '^URIs:' "$work/nonfree.sources" || { echo "install-nsys: no bookworm stanza in $sources" >&2; exit 1; }

apt_private=(-o "Dir::State::Lists=$work/lists" -o "Dir::Etc::SourceList=/dev/null"
             -o "Dir::Etc::SourceParts=$work/parts" -o "Dir::Cache::archives=$work/debs")
mkdir -p "$work/parts"
cp "$work/nonfree.sources" "$work/parts/nonfree.sources"
apt-get "${apt_private[@]}" update -qq
(cd "$work/debs" && apt-get "${apt_private[@]}" download nsight-systems nsight-systems-target)

# The host tools need libssh at run time. (The pipelines below read ldconfig's whole output: a reader
# that stops early, grep -q or awk's exit, would kill ldconfig with SIGPIPE and, under pipefail, fail
# the step even when the library is there.)
if ! ldconfig -p | grep 'libssh\.so\.4' >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        # wait for another apt (unattended upgrades, a parallel job) rather than fail on its lock
        apt-get -o DPkg::Lock::Timeout=300 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq libssh-4 >/dev/null
    else
        echo "install-nsys: libssh-4 is missing; install it (apt-get install libssh-4) and re-run" >&2
        exit 1
    fi
fi

mkdir -p "$prefix"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$prefix"; done

host=$prefix/usr/lib/nsight-systems/host-linux-x64
libssh=$(ldconfig -p | awk '/libssh\.so\.4 / && !found {found = $NF} END {print found}')
ln -sf "$libssh" "$host/libssh.so"
mkdir -p "$prefix/usr/lib/x86_64-linux-gnu/nsight-systems"
ln -sfn "$host" "$prefix/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64"

"$nsys_bin" --version >&2
echo "$nsys_bin"
