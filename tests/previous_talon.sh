#!/bin/bash
# Builds the talon binary of an earlier commit for the upgrade tests in tests/restart_io.rs and
# the v1_scale bench, and prints its path:
#
#   export TALON_PREVIOUS_BIN=$(tests/previous_talon.sh [REV])
#
# The tests need not be told: without TALON_PREVIOUS_BIN they build the pinned commit
# (tests/data/previous-talon.rev, see tests/support/previous_talon.rs) the same way, once.
# The tree is `git archive`d to target/previous-talon/src-<rev> and built there with a target
# dir of its own (no debuginfo), so this checkout's target/debug/talon is never overwritten
# while tests may be running it; the binary stays as target/previous-talon/talon-<rev>.
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-$(cat tests/data/previous-talon.rev)}
REV=$(git rev-parse --short=9 "$REV^{commit}")
CACHE=${CARGO_TARGET_DIR:-$PWD/target}/previous-talon
BIN=$CACHE/talon-$REV
if [ ! -x "$BIN" ]; then
	SRC=$CACHE/src-$REV
	rm -rf "$SRC" && mkdir -p "$SRC"
	git archive "$REV" | tar -x -C "$SRC"
	(cd "$SRC" && CARGO_TARGET_DIR="$CACHE/target" CARGO_PROFILE_DEV_DEBUG=false CARGO_INCREMENTAL=0 \
		cargo build --quiet --locked --bin talon >&2)
	cp "$CACHE/target/debug/talon" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
	rm -rf "$SRC" "$CACHE/target"
fi
echo "$BIN"
