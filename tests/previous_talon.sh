#!/bin/bash
# Builds the talon binary of an earlier commit (default: where this branch left main) for the
# upgrade test in tests/restart_io.rs, and prints its path:
#
#   export TALON_PREVIOUS_BIN=$(tests/previous_talon.sh [REV])
#   cargo nextest run --test restart_io
#
# The tree goes to $TMPDIR/talon-previous-<rev>; the build shares this checkout's target dir
# (CARGO_TARGET_DIR or ./target), so only the talon crate is compiled again; the checkout's own
# target/debug/talon is linked again afterwards (both builds write that path).
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-$(git merge-base HEAD main)}
REV=$(git rev-parse --short "$REV")
SRC=${TMPDIR:-/tmp}/talon-previous-$REV
if [ ! -f "$SRC/Cargo.toml" ]; then
	mkdir -p "$SRC"
	git archive "$REV" | tar -x -C "$SRC"
fi
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
(cd "$SRC" && CARGO_TARGET_DIR="$TARGET" cargo build --quiet --bin talon >&2)
cp "$TARGET/debug/talon" "$SRC/talon"
touch src/main.rs
CARGO_TARGET_DIR="$TARGET" cargo build --quiet --bin talon >&2
echo "$SRC/talon"
