#!/usr/bin/env bash
# Installs the Debian packages parley's tests and tools use, only those that are missing.
#   espeak-ng, sox        speech audio for tests and benchmarks
#   chromium(-driver)     the real browser of the browser tests
#   baresip-core          a real SIP softphone (plays a WAV, records the reply, sends DTMF)
#   sip-tester            SIPp, the SIP load and conformance tester
#   prometheus            a real Prometheus (and promtool) for the dashboard and alert tests
#   postgresql            a throw-away PostgreSQL cluster for the call-records tests (initdb, pg_ctl)
#   kamailio              the SIP dispatcher of deploy/kamailio, in front of instances in tests/fleet
#   haproxy               the HTTP proxy of deploy/haproxy, in front of instances in tests/fleet
#   g++, cmake            build llama.cpp (llama-cpp-python ships no wheel), the CPU's LLM runtime
set -euo pipefail
packages=(espeak-ng sox chromium chromium-driver libsndfile1 baresip-core sip-tester prometheus postgresql kamailio haproxy g++ cmake)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing system packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
