#!/usr/bin/env bash
# Runs every test of talon on a fresh Debian 12 machine: installs what the tests
# need (Debian packages listed in tests/apt-packages.txt, cargo-nextest if absent),
# then runs the whole suite, the QEMU guest tests included.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	mapfile -t pkgs < <(grep -Ev '^\s*(#|$)' tests/apt-packages.txt)
	missing=()
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		echo "run-all: installing ${missing[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
else
	echo "run-all: not root or no apt-get: not installing test packages; tests that need them will skip"
fi
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest

# Python tools the tests use (tests/pip-packages.txt), in a venv inside target/.
VENV=target/test-venv
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
	if python3 -m venv "$VENV" && "$VENV/bin/pip" install -q -r tests/pip-packages.txt; then
		echo "run-all: installed tests/pip-packages.txt into $VENV"
	else
		echo "run-all: could not install tests/pip-packages.txt; the tests that need it will skip"
	fi
fi
export PATH="$PWD/$VENV/bin:$PATH"

# One clean build gains nothing from incremental state (gigabytes on disk).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

cargo build --workspace --all-targets
rc=0
cargo nextest run --workspace --no-fail-fast "$@" || rc=$?
# skips are reported as skips, with their reasons, not as passes (tests/summary.py)
python3 tests/summary.py target/nextest/default/junit.xml || true
exit "$rc"
