#!/usr/bin/env python3
"""talon's test summary, from nextest's JUnit report.

nextest has no way for a test to skip itself at run time, so a test that
cannot run here (no SPDK, no root, no guest) prints `SKIP <test>: <reason>`
and returns. This turns those into what they are: a test whose only outcome
was a skip is counted as skipped, not passed, with its reason; a test that
ran and skipped a part (a guest step, half of its checks) is counted as passed
and its skipped parts are listed. Usage: summary.py <junit.xml>; exit status 0.
"""
import re
import sys
import xml.etree.ElementTree as ET

SLOWEST = 15
SKIP = re.compile(r"^SKIP ([^:]+): (.*)$")
# A peer's own bug that a test met and got past with the peer's documented remedy (a Longhorn
# manager race, for one): the test passed, and the summary says what it had to do.
PEER = re.compile(r"^PEER (.*)$")
# The lines that say why a test failed: the panic's place and its first line, a driver's FAILED,
# a guest step's FAIL. A CI log is shown cut in the middle, so the summary repeats them.
# A driver's `why: ` lines are its failure's state (the Longhorn objects, the last words of the
# manager and talon), printed right after its FAILED.
WHY = re.compile(r"panicked at |FAILED: |^\s*why: |^vm: step \S+ FAIL|^vm: the guest never")


def reasons(out: str, most: int = 60) -> list:
    """The first `most` lines of `out` that say why its test failed (a panic's next line too)."""
    lines, found = out.splitlines(), []
    for i, line in enumerate(lines):
        if WHY.search(line):
            found.append(line.strip()[:400])
            if "panicked at " in line and i + 1 < len(lines):
                found.append(lines[i + 1].strip()[:400])
    seen = []
    for f in found:
        if f not in seen:
            seen.append(f)
    return seen[:most]


def main(path: str) -> None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"test summary: no JUnit report at {path} ({e})")
        return
    passed, failed, skipped, parts, times, peers = 0, [], [], [], [], []
    for case in root.iter("testcase"):
        name = case.get("name", "")
        binary = case.get("classname", "")
        try:
            times.append((float(case.get("time", "0")), f"{binary} {name}"))
        except ValueError:
            pass
        short = name.rsplit("::", 1)[-1]
        out = "\n".join((e.text or "") for e in case if e.tag in ("system-out", "system-err"))
        if any(e.tag in ("failure", "error") for e in case):
            failed.append((f"{binary} {name}", reasons(out)))
            continue
        if any(e.tag == "skipped" for e in case):
            skipped.append((f"{binary} {name}", "filtered or ignored"))
            continue
        own, other = None, []
        for line in out.splitlines():
            p = PEER.match(line.strip())
            if p and f"{binary} {name}: {p.group(1)}" not in peers:
                peers.append(f"{binary} {name}: {p.group(1)}")
            m = SKIP.match(line.strip())
            if not m:
                continue
            if m.group(1) == short:
                own = own or m.group(2)
            else:
                other.append(f"{m.group(1)}: {m.group(2)}")
        if own is not None:
            skipped.append((f"{binary} {name}", own))
        else:
            passed += 1
            parts.extend(f"{binary} {name}: {o}" for o in other)
    print("\n======== talon test summary (skips are not passes) ========")
    for t, why in skipped:
        print(f"SKIPPED  {t}: {why}")
    for p in parts:
        print(f"PART SKIPPED  {p}")
    for p in peers:
        print(f"PEER BUG MET  {p}")
    for f, lines in failed:
        print(f"FAILED   {f}")
        for line in lines:
            print(f"    {line}")
    # The slowest tests: what to make faster when a cold CI run nears its 60 minutes.
    times.sort(reverse=True)
    if times:
        print(f"slowest {min(SLOWEST, len(times))} tests (seconds; the real-SPDK group runs one at a time):")
        for t, n in times[:SLOWEST]:
            print(f"  {t:8.1f}  {n}")
    print(
        f"talon tests: {passed} passed, {len(skipped)} skipped, {len(failed)} failed"
        + (f" ({len(parts)} skipped parts of passed tests listed above)" if parts else "")
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/nextest/default/junit.xml")
