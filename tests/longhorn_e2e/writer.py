"""A multipath NVMe/TCP host that writes and verifies while a volume's engine moves (issue 53).

SPDK's bdevperf (in TALON_SPDK_DIR, as spdk_dd) is the host: its NVMe bdev with multipath on
(`bdev_nvme_attach_controller -x multipath`, one controller name for every path of the
subsystem) follows the listeners' ANA states and retries an I/O on another path when one fails
(`bdev_retry_count -1`: as a kernel host queues I/O while no path is live, up to its controller
loss timeout). The `verify` workload writes each block and reads it back compared, so a write
the move lost or a read of old data fails it.

    w = Writer(spdk_dir, work, host_nqn, block_size, offset, length)
    w.start(addr, port, nqn)      the first path; writing and verifying from then on
    w.add_path(addr, port)        another engine's export of the same subsystem (idempotent)
    w.kill()                      what is left goes (after a failure)
    w.stop()  -> dict             SIGINT: bdevperf ends the run and answers perform_tests with
                                  its result (status, iops, io_failed, io_timeout, the longest
                                  I/O in us); raises when an I/O failed, a block read back
                                  differed, or nothing was written
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time


class Writer:
    def __init__(self, spdk_dir, work, host_nqn, block_size, offset, length):
        self.spdk_dir, self.work, self.host_nqn = spdk_dir, work, host_nqn
        self.sock, self.log = f"{work}/writer.sock", f"{work}/writer.log"
        self.block_size, self.offset, self.length = block_size, offset, length
        self.proc, self.thread, self.answer, self.paths = None, None, None, []
        self.refused = []  # connects refused and tried again

    def rpc(self, *args):
        r = subprocess.run([sys.executable, f"{self.spdk_dir}/scripts/rpc.py", "-s", self.sock, *args],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"writer: rpc.py {' '.join(args)}: {r.stdout[-1500:]}{r.stderr[-1500:]}")
        return r.stdout

    def start(self, addr, port, nqn):
        self.nqn = nqn
        job = f"{self.work}/writer.ini"
        with open(job, "w") as f:
            # bdevperf's job offsets and lengths are in blocks
            f.write(f"[global]\nfilename=w0n1\n[move]\nrw=verify\nbs=4096\niodepth=8\n"
                    f"offset={self.offset // self.block_size}\nlength={self.length // self.block_size}\n")
        if os.path.exists(self.sock):
            os.remove(self.sock)
        self.proc = subprocess.Popen(
            [f"{self.spdk_dir}/build/bin/bdevperf", "--no-huge", "-s", "512", "-u", "--disable-cpumask-locks",
             "-m", "0x2", "-r", self.sock, "-z", "-j", job, "-t", "600"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"writer: bdevperf did not start: {self.tail()}")
            time.sleep(0.1)
        time.sleep(0.3)
        self.rpc("bdev_nvme_set_options", "--bdev-retry-count", "-1")
        self.add_path(addr, port)
        self.thread = threading.Thread(target=self.perform, daemon=True)
        self.thread.start()
        time.sleep(1)
        if self.answer is not None:
            raise RuntimeError(f"writer: ended at once: {self.answer}; {self.tail()}")

    def add_path(self, addr, port):
        if (addr, str(port)) in self.paths:
            return
        # an export closed for a moment (its member moving back to its lvol after a move)
        # refuses the connect: tried again as a host connects again (`refused`)
        for attempt in range(1, 6):
            try:
                self.rpc("bdev_nvme_attach_controller", "-b", "w0", "-t", "tcp", "-f", "ipv4", "-a", addr,
                         "-s", str(port), "-n", self.nqn, "-q", self.host_nqn, "-x", "multipath",
                         "--ctrlr-loss-timeout-sec", "30", "--reconnect-delay-sec", "1")
                break
            except RuntimeError:
                if attempt == 5:
                    raise
                self.refused.append(f"{addr}:{port}")
                time.sleep(1)
        self.paths.append((addr, str(port)))

    def perform(self):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(self.sock)
            s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "perform_tests"}).encode())
            buf = b""
            while True:
                d = s.recv(65536)
                if not d:
                    self.answer = {"error": f"connection closed: {buf[-500:]!r}"}
                    return
                buf += d
                try:
                    self.answer = json.loads(buf)
                    return
                except ValueError:
                    pass
        except OSError as e:
            self.answer = {"error": str(e)}
        finally:
            s.close()

    def tail(self):
        try:
            lines = open(self.log, errors="replace").read().splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-25:])

    def kill(self):
        """Whatever is left of bdevperf goes (a step that failed before `stop`)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        """Ends the run; returns bdevperf's result of the one job. Raises on any failure."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        self.thread.join(30)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        a = self.answer or {}
        log = open(self.log, errors="replace").read()
        results = (a.get("result") or {}).get("results") or []
        if "error" in a or len(results) != 1:
            raise AssertionError(f"writer: no result from bdevperf: {a}\n{self.tail()}")
        r = results[0]
        if r.get("status") not in ("terminated", "finished") or r.get("io_failed") or r.get("io_timeout") \
                or "mismatch" in log.lower() or "miscompare" in log.lower():
            raise AssertionError(f"writer: I/O failed or read back different during the move: {r}\n{self.tail()}")
        if not r.get("iops"):
            raise AssertionError(f"writer: nothing written: {r}")
        return r
