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
# (again when the list changed since: its stamp is older)
if [ ! -f "$VENV/.pip-stamp" ] || [ tests/pip-packages.txt -nt "$VENV/.pip-stamp" ]; then
	if python3 -m venv "$VENV" && "$VENV/bin/pip" install -q -r tests/pip-packages.txt; then
		touch "$VENV/.pip-stamp"
		echo "run-all: installed tests/pip-packages.txt into $VENV"
	else
		echo "run-all: could not install tests/pip-packages.txt; the tests that need it will skip"
	fi
fi
export PATH="$PWD/$VENV/bin:$PATH"

# The real-SPDK tests (the V2 data path) run against the prebuilt SPDK v26.05 beside the
# checkout when there is one (../shared/spdk/v26.05, as in CI); an explicit TALON_SPDK_DIR wins.
if [ -z "${TALON_SPDK_DIR:-}" ] && [ -x ../shared/spdk/v26.05/build/bin/spdk_tgt ]; then
	TALON_SPDK_DIR=$(cd ../shared/spdk/v26.05 && pwd)
fi
if [ -n "${TALON_SPDK_DIR:-}" ]; then
	export TALON_SPDK_DIR
	echo "run-all: real-SPDK tests use TALON_SPDK_DIR=$TALON_SPDK_DIR"
else
	echo "run-all: no SPDK (set TALON_SPDK_DIR to an SPDK build): the real-SPDK tests will skip"
fi

# The cross-check with Longhorn's own backupstore library (tests/backupstore_longhorn.rs) runs
# the program built from it beside the checkout (../shared/longhorn/backupstore-tool, as in CI),
# unpacked into target/ and checked against its README's sha256; an explicit
# TALON_LONGHORN_BACKUPSTORE wins.
LH_TOOL=../shared/longhorn/backupstore-tool/longhorn-backupstore.xz
LH_TOOL_SHA=1e57018e6ee68e8df66c8a6ce8a9cf75a999b8c2e26f21dc327d4631bc73d412
if [ -z "${TALON_LONGHORN_BACKUPSTORE:-}" ] && [ -f "$LH_TOOL" ]; then
	mkdir -p target
	if ! echo "$LH_TOOL_SHA  target/longhorn-backupstore" | sha256sum -c --status 2>/dev/null; then
		xz -dc "$LH_TOOL" > target/longhorn-backupstore.part && chmod +x target/longhorn-backupstore.part &&
			mv target/longhorn-backupstore.part target/longhorn-backupstore
	fi
	if echo "$LH_TOOL_SHA  target/longhorn-backupstore" | sha256sum -c --status; then
		export TALON_LONGHORN_BACKUPSTORE="$PWD/target/longhorn-backupstore"
		echo "run-all: Longhorn's backupstore library: $TALON_LONGHORN_BACKUPSTORE"
	else
		echo "run-all: $LH_TOOL did not unpack to the program its README names (sha256); the cross-check will skip"
	fi
fi

# One clean build gains nothing from incremental state (gigabytes on disk).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

T0=$(date +%s)
cargo build --workspace --all-targets
# The upgrade tests' earlier talon (tests/data/previous-talon.rev) is built here, while the
# machine is otherwise idle (~1.5 min), not inside a test under the suite's load (690 s seen).
if [ -z "${TALON_PREVIOUS_BIN:-}" ]; then
	if bin=$(tests/previous_talon.sh 2>/tmp/talon-previous-build.log); then
		export TALON_PREVIOUS_BIN=$bin
		echo "run-all: earlier talon for the upgrade tests: $bin"
	else
		echo "run-all: could not build the earlier talon (tests/previous_talon.sh; the upgrade tests try again):"
		tail -5 /tmp/talon-previous-build.log
	fi
fi
rc=0
cargo nextest run --workspace --no-fail-fast "$@" || rc=$?
# skips are reported as skips, with their reasons, not as passes (tests/summary.py)
python3 tests/summary.py target/nextest/default/junit.xml || true
echo "run-all: build and tests took $(($(date +%s) - T0)) s"
exit "$rc"
