#!/usr/bin/env bash
# Starts talon on an embedded default, from a fresh Debian machine:
#   - first checks what the build needs and this script does not install: Rust (cargo, at
#     least Cargo.toml's rust-version) and a C compiler (cc), and says how to install them,
#   - installs what the V1 engine needs when SPDK is absent (tgt) and an iSCSI
#     client to read the volume with (libiscsi-bin),
#   - builds talon, serves from a data dir in the working tree (./talon-data),
#   - declares a first volume "demo" and prints commands that work as printed:
#     the CLI (TALON_SOCKET and the binary's path) and an iSCSI read of "demo" as
#     the client deploy/quickstart.yaml admits.
# A second run reuses ./talon-data (same volume, same data). Ctrl-C stops talon cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${TALON_DATA_DIR:-$PWD/talon-data}
SOCK=$DATA/talon.sock
# the client deploy/quickstart.yaml admits (allowedHosts), its port (iscsiPort)
CLIENT_IQN=iqn.2025-01.io.talon.quickstart:client
PORTAL=127.0.0.1:3262

# The build's own needs, before anything is installed or built: Rust at least Cargo.toml's
# rust-version (Debian's packaged rustc is older: rustup) and a C compiler (cc, for the
# crates that build C code).
RUST_MIN=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml | head -n1)
RUST_MIN=${RUST_MIN:-1.90}
RUSTUP="curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y && . \"\$HOME/.cargo/env\""
command -v curl >/dev/null || RUSTUP="apt-get install curl ca-certificates && $RUSTUP"
missing=0
if ! command -v cargo >/dev/null; then
	echo "quickstart: cargo is missing: talon builds with Rust $RUST_MIN or newer. Install it with rustup:" >&2
	echo "  $RUSTUP" >&2
	missing=1
else
	have=$(rustc --version 2>/dev/null | awk '{print $2}')
	if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$RUST_MIN" "$have" | sort -V | head -n1)" != "$RUST_MIN" ]; then
		echo "quickstart: rustc ${have:-?} is older than the Rust $RUST_MIN talon needs (Cargo.toml rust-version)." >&2
		if command -v rustup >/dev/null; then
			echo "  rustup update stable" >&2
		else
			echo "  Debian's rustc is too old; install Rust with rustup (first: apt-get remove rustc cargo):" >&2
			echo "  $RUSTUP" >&2
		fi
		missing=1
	fi
fi
if ! command -v cc >/dev/null; then
	echo "quickstart: a C compiler (cc) is missing; some crates build C code. Install it:" >&2
	echo "  apt-get install gcc" >&2
	missing=1
fi
if [ "$missing" = 1 ]; then
	echo "quickstart: then run deploy/quickstart.sh again" >&2
	exit 1
fi

apt_install() {
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "quickstart: installing $* ($why)"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
	else
		echo "quickstart: $why is missing and I cannot install it (run as root on Debian)" >&2
		return 1
	fi
}
if ! command -v tgtd >/dev/null && [ -z "${TALON_SPDK_DIR:-}" ]; then
	why="tgt: the V1 engine's iSCSI target" apt_install tgt ||
		{ echo "quickstart: or set TALON_SPDK_DIR for the V2 engine" >&2; exit 1; }
fi
if ! command -v iscsi-inq >/dev/null; then
	why="libiscsi-bin: an iSCSI client to read the volume with" apt_install libiscsi-bin ||
		echo "quickstart: going on without it; install libiscsi-bin to read the volume" >&2
fi

BIN=$PWD/target/release/talon
echo "quickstart: building talon (cargo build --release). The first build takes about 20 minutes"
echo "  on 2 cores (later runs: seconds; a few minutes after a change to talon's code), with cargo's"
echo "  lines meanwhile. Then talon starts and serves the volume \"demo\"; the last lines here are"
echo "  the commands to try, ending with an iSCSI read of \"demo\"."
cargo build --release --bin talon

mkdir -p "$DATA"
"$BIN" --socket "$SOCK" serve --data-dir "$DATA" --run-dir "$DATA/run" --config deploy/quickstart.yaml &
PID=$!
trap 'kill -INT $PID 2>/dev/null; wait $PID' INT TERM
for _ in $(seq 100); do [ -S "$SOCK" ] && break; kill -0 $PID 2>/dev/null || exit 1; sleep 0.1; done
echo
"$BIN" --socket "$SOCK" volume wait demo --timeout 120
TARGET=$("$BIN" --socket "$SOCK" get enginestatus demo -o json | sed -n 's/^ *"name": "\(iqn\.[^"]*\)".*/\1/p' | head -n1)
TARGET=${TARGET:-iqn.2025-01.io.talon:demo}
echo
echo "talon is serving (pid $PID, data in $DATA). In another shell, as root:"
echo "  export TALON_SOCKET=$SOCK"
echo "  alias talon=$BIN"
echo "  talon get volume demo"
echo "  talon volume list"
echo "  talon get controllers"
echo "Read \"demo\" over iSCSI as the quick start's client ($CLIENT_IQN, allowedHosts in deploy/quickstart.yaml):"
echo "  iscsi-inq -i $CLIENT_IQN iscsi://$PORTAL/$TARGET/1"
echo "  iscsi-readcapacity16 -i $CLIENT_IQN iscsi://$PORTAL/$TARGET/1"
echo "  iscsi-ls -i $CLIENT_IQN -s iscsi://$PORTAL"
echo "Ctrl-C stops it; the next run reuses the same data."
wait $PID
