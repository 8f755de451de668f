#!/usr/bin/env bash
# Starts talon on an embedded default, from a fresh Debian machine:
#   - installs what the V1 engine needs when SPDK is absent (tgt),
#   - builds talon, serves from a data dir in the working tree (./talon-data),
#   - declares a first volume "demo" and prints how an initiator reaches it.
# A second run reuses ./talon-data (same volume, same data). Ctrl-C stops talon cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${TALON_DATA_DIR:-$PWD/talon-data}
SOCK=$DATA/talon.sock

if ! command -v tgtd >/dev/null && [ -z "${TALON_SPDK_DIR:-}" ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "quickstart: installing tgt (the V1 engine's iSCSI target)"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tgt >/dev/null
	else
		echo "quickstart: tgtd is missing and I cannot install it (run as root on Debian, or set TALON_SPDK_DIR)" >&2
		exit 1
	fi
fi
cargo build --release --bin talon
BIN=$PWD/target/release/talon

mkdir -p "$DATA"
"$BIN" --socket "$SOCK" serve --data-dir "$DATA" --run-dir "$DATA/run" --config deploy/quickstart.yaml &
PID=$!
trap 'kill -INT $PID 2>/dev/null; wait $PID' INT TERM
for _ in $(seq 100); do [ -S "$SOCK" ] && break; kill -0 $PID 2>/dev/null || exit 1; sleep 0.1; done
echo
"$BIN" --socket "$SOCK" volume wait demo --timeout 120
echo
echo "talon is serving (pid $PID, data in $DATA). Try:"
echo "  $BIN --socket $SOCK get volume"
echo "  $BIN --socket $SOCK get controllers"
echo "Ctrl-C stops it; the next run reuses the same data."
wait $PID
