# tests/vm/host/spdk.sh - sourced by step host hooks that need SPDK's NVMe/TCP target on the host:
# $TALON_SPDK_DIR/build/bin/spdk_tgt (no hugepages needed: --no-huge) with its RPC socket in the
# hook's directory, listening on a free port of 127.0.0.1 only.
#
#   . "$TALON_VM_HOST_LIB/spdk.sh"
#   spdk_start || exit 0            -> SPDK_PID; prints "pid <PID>" (or "skip <reason>" and fails)
#   spdk_rpc <method> [args...]     scripts/rpc.py against this target
#   spdk_export_file NQN FILE PORT  AIO bdev on FILE, TCP transport, subsystem NQN, listener 127.0.0.1:PORT
#   spdk_stop                       SIGINT, wait (bounded)
SPDK_SOCK=$PWD/spdk/spdk.sock

spdk_start() {
	if [ -z "${TALON_SPDK_DIR:-}" ]; then echo "skip TALON_SPDK_DIR is not set"; return 1; fi
	local bin=$TALON_SPDK_DIR/build/bin/spdk_tgt
	[ -x "$bin" ] || { echo "skip no $bin (build SPDK first)"; return 1; }
	command -v python3 >/dev/null || { echo "skip python3 is missing (SPDK's scripts/rpc.py)"; return 1; }
	mkdir -p "$PWD/spdk"
	"$bin" -m 0x1 --no-huge -s 1024 -r "$SPDK_SOCK" >"$PWD/spdk/spdk_tgt.log" 2>&1 </dev/null &
	SPDK_PID=$!
	echo "$SPDK_PID" >"$PWD/spdk/pid"
	echo "pid $SPDK_PID"
	for _ in $(seq 100); do
		spdk_rpc spdk_get_version >/dev/null 2>&1 && return 0
		kill -0 "$SPDK_PID" 2>/dev/null || break
		sleep 0.1
	done
	echo "spdk_tgt did not answer on $SPDK_SOCK:" >&2
	tail -20 "$PWD/spdk/spdk_tgt.log" >&2
	return 2
}

spdk_rpc() { python3 "$TALON_SPDK_DIR/scripts/rpc.py" -s "$SPDK_SOCK" -t 10 "$@"; }

spdk_export_file() { # nqn file port
	spdk_rpc bdev_aio_create "$2" vmaio0 512 >&2 &&
		spdk_rpc nvmf_create_transport -t TCP >&2 &&
		spdk_rpc nvmf_create_subsystem "$1" -a -s TALON0000000001 >&2 &&
		spdk_rpc nvmf_subsystem_add_ns "$1" vmaio0 >&2 &&
		spdk_rpc nvmf_subsystem_add_listener "$1" -t tcp -f ipv4 -a 127.0.0.1 -s "$3" >&2
}

spdk_stop() {
	[ -f "$PWD/spdk/pid" ] || return 0
	local pid
	pid=$(cat "$PWD/spdk/pid")
	kill -0 "$pid" 2>/dev/null || return 0
	kill -INT "$pid"
	for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
}
