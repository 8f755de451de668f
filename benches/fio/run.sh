#!/bin/sh
# benches/fio/run.sh - talon's standard fio set on one block device, results appended as JSON lines.
#
#   run.sh --device /dev/talon/<vol> [--label engine=v2,replicas=2,frontend=nvme-tcp]
#          [--results FILE] [--jobs randread-4k-qd1,...] [--runtime S]
#
#   jobs/<name>.fio ── fio --output-format=json ── one line {"label","job","device","fio":{...}}
#                                                   appended to FILE (default ./fio-results.jsonl)
#                  └── one markdown table row per job on stdout
#   cargo bench --bench fio_report -- FILE...  ── table + SVG chart comparing the labels
#
# WARNING: the write jobs overwrite the device. Point it at a scratch volume.
# Env: TALON_FIO_RUNTIME (s per job, default 10), TALON_FIO_RAMP (s, default 1), TALON_FIO_SIZE
# (span of the device the jobs use, default 100%), FIO (the fio binary, default fio).
# POSIX sh (busybox too: the QEMU guest step tests/vm/steps/fio-bench.sh runs it).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
DEVICE=""
LABEL="default"
RESULTS="$PWD/fio-results.jsonl"
JOBS=""
FIO=${FIO:-fio}
: "${TALON_FIO_RUNTIME:=10}" "${TALON_FIO_RAMP:=1}" "${TALON_FIO_SIZE:=100%}"

usage() { sed -n '4,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
	case "$1" in
	--device) DEVICE=${2:?--device needs a value}; shift 2 ;;
	--label) LABEL=${2:?--label needs a value}; shift 2 ;;
	--results) RESULTS=${2:?--results needs a value}; shift 2 ;;
	--jobs) JOBS=${2:?--jobs needs a value}; shift 2 ;;
	--runtime) TALON_FIO_RUNTIME=${2:?--runtime needs a value}; shift 2 ;;
	-h | --help) usage ;;
	*) echo "run.sh: unknown argument '$1'" >&2; usage ;;
	esac
done
[ -n "$DEVICE" ] || { echo "run.sh: --device is required" >&2; usage; }
[ -b "$DEVICE" ] || { echo "run.sh: $DEVICE is not a block device" >&2; exit 1; }
# the label goes into JSON unescaped: keep it to a safe alphabet
case "$LABEL" in *[!A-Za-z0-9=,._:/+-]* | "") echo "run.sh: label '$LABEL' has characters outside [A-Za-z0-9=,._:/+-]" >&2; exit 2 ;; esac
case "$TALON_FIO_RUNTIME" in *[!0-9]* | "") echo "run.sh: runtime '$TALON_FIO_RUNTIME' is not a whole number of seconds" >&2; exit 2 ;; esac
command -v "$FIO" >/dev/null || { echo "run.sh: $FIO not found (Debian package fio)" >&2; exit 1; }
if [ -z "$JOBS" ]; then
	JOBS=$(cd "$HERE/jobs" && ls -- *.fio | sed 's/\.fio$//' | paste -sd, -)
fi
export TALON_FIO_DEVICE="$DEVICE" TALON_FIO_RUNTIME TALON_FIO_RAMP TALON_FIO_SIZE
TMP=$(mktemp -d "${TMPDIR:-/tmp}/talon-fio.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

# one table row from fio's JSON flattened to one line: IOPS and MiB/s of read+write,
# completion-latency p50/p99 of the direction with more I/Os
row() {
	awk -v label="$1" -v job="$2" '
	function num(s, key,   r) {
		if (!match(s, "\"" key "\":[-0-9.e+]+")) return 0
		r = substr(s, RSTART, RLENGTH); sub(/.*:/, "", r); return r + 0
	}
	function sect(s, from, to,   a, b) {
		a = index(s, "\"" from "\":{"); if (a == 0) return ""
		s = substr(s, a); b = index(s, "\"" to "\":{"); return b ? substr(s, 1, b - 1) : s
	}
	{
		s = $0; gsub(/[ \t]/, "", s)
		r = sect(s, "read", "write"); w = sect(s, "write", "trim")
		iops = num(r, "iops") + num(w, "iops")
		bw = (num(r, "bw_bytes") + num(w, "bw_bytes")) / 1048576
		d = (num(r, "total_ios") >= num(w, "total_ios")) ? r : w
		c = sect(d, "clat_ns", "lat_ns")
		printf "| %s | %s | %.0f | %.1f | %.1f | %.1f |\n", label, job, iops, bw, num(c, "50.000000") / 1000, num(c, "99.000000") / 1000
		if (index(s, "\"error\":0") == 0) exit 3
	}'
}

echo "| label | job | IOPS | MiB/s | clat p50 (us) | clat p99 (us) |"
echo "|---|---|---:|---:|---:|---:|"
rc=0
for job in $(echo "$JOBS" | tr ',' ' '); do
	f=$HERE/jobs/$job.fio
	[ -f "$f" ] || { echo "run.sh: no job file $f" >&2; rc=1; continue; }
	if ! "$FIO" --eta=never --output-format=json --output="$TMP/$job.json" "$f" 2>"$TMP/$job.err"; then
		echo "run.sh: fio $job failed on $DEVICE:" >&2; cat "$TMP/$job.err" >&2; rc=1; continue
	fi
	# fio may print notes before the JSON object: keep from the first "{" line on
	flat=$(sed -n '/^{/,$p' "$TMP/$job.json" | tr -d '\n')
	[ -n "$flat" ] || { echo "run.sh: fio $job wrote no JSON" >&2; rc=1; continue; }
	printf '{"label":"%s","job":"%s","device":"%s","fio":%s}\n' "$LABEL" "$job" "$DEVICE" "$flat" >>"$RESULTS"
	echo "$flat" | row "$LABEL" "$job" || { echo "run.sh: fio $job reported an I/O error" >&2; rc=1; }
done
echo "run.sh: results appended to $RESULTS" >&2
exit $rc
