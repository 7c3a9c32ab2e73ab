"""What the operator process keeps per object at rest: tracemalloc and gc, not only RSS.

    .venv/bin/python -m bench.mem_probe --configmaps 2500 --secrets 2500 [--pods 0] [--ics 0] [--operators ...]

Runs ``kopf run --standalone --all-namespaces operators/*.py`` (default log level, as the chart) in a
child process that starts ``tracemalloc`` first; on SIGUSR1 the child runs ``gc.collect()`` and glibc's
``malloc_trim(0)`` and writes a snapshot (Python allocations still alive, by line), the number of
gc-tracked objects by type, and VmRSS before and after the trim. The parent takes one snapshot once
the operator is quiet, creates the objects (64 requests in flight, admin credentials, a namespace of
its own), waits until the operator is quiet again, takes a second, deletes the namespace, waits, and
takes a third; then prints the differences per object. RSS under tracemalloc is higher than without
it (each traced block costs ~60 bytes more): the RSS figures are for comparing runs of this probe only;
the bench's ``memory`` section gives the real ones. See docs/performance.md, "Memory per object at rest".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from bench.kube import Kube, bounded

REPO = Path(__file__).resolve().parent.parent


# --- the child: the operator, in-process with tracemalloc ----------------------------------------------

def _rss_kb(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _pymalloc() -> dict[str, int]:
    """pymalloc's own figures (``sys._debugmallocstats``, written to the C stderr): how much of its arenas
    the live small objects use. Arenas that a few long-lived objects keep are what RSS holds at rest."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    figures: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if line.startswith("# ") and value.strip().replace(",", "").isdigit():
            figures[name.strip("# ").strip()] = int(value.strip().replace(",", ""))
    return figures


def _dump(outdir: Path) -> None:
    seq = len(list(outdir.glob("snap-*.json")))
    rss_before = _rss_kb()
    gc.collect()
    rss_gc = _rss_kb()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss_trimmed = _rss_kb()
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(str(outdir / f"snap-{seq}.trace"))
    else:
        tracemalloc.Snapshot([], 1).dump(str(outdir / f"snap-{seq}.trace"))
    traced, peak = tracemalloc.get_traced_memory()
    (outdir / f"snap-{seq}.json").write_text(json.dumps({
        "rss_kb": rss_before, "hwm_kb": _rss_kb("VmHWM"), "rss_gc_kb": rss_gc, "rss_trimmed_kb": rss_trimmed,
        "traced": traced, "traced_peak": peak, "types": dict(types), "pymalloc": _pymalloc()}))


def child(outdir: Path, kopf_args: list[str]) -> None:
    frames = int(os.environ.get("MEM_PROBE_FRAMES", "12"))  # 0: no tracemalloc (RSS as without it)
    if frames:
        tracemalloc.start(frames)
    signal.signal(signal.SIGUSR1, lambda *_: _dump(outdir))
    from kopf.cli import main
    sys.argv = ["kopf", *kopf_args]
    main()


# --- the parent: objects in, snapshots, the report --------------------------------------------------------

class Probe:
    def __init__(self, outdir: Path, files: list[str], kubeconfig: Path) -> None:
        self.outdir = outdir
        outdir.mkdir(parents=True, exist_ok=True)
        for old in outdir.glob("snap-*"):
            old.unlink()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.log = (outdir / "operator.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.mem_probe", "child", str(outdir), "--",
             "run", "--standalone", "--all-namespaces", *files],
            cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    async def settle(self) -> None:
        """Until the operator is quiet (the harness's measure of quiet, with a burst's longer timeout)."""
        from bench.harness import Proc  # here: the child, the measured operator, never imports it

        await Proc(self.proc.pid).settle(timeout=600)

    async def snapshot(self) -> tuple[tracemalloc.Snapshot, dict[str, Any]]:
        seq = len(list(self.outdir.glob("snap-*.json")))
        os.kill(self.proc.pid, signal.SIGUSR1)
        meta = self.outdir / f"snap-{seq}.json"
        while not meta.exists():
            await asyncio.sleep(0.5)
        await asyncio.sleep(0.5)
        return tracemalloc.Snapshot.load(str(self.outdir / f"snap-{seq}.trace")), json.loads(meta.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def report(label: str, count: int, a: tuple[tracemalloc.Snapshot, dict[str, Any]],
           b: tuple[tracemalloc.Snapshot, dict[str, Any]], top: int) -> dict[str, Any]:
    (snap_a, meta_a), (snap_b, meta_b) = a, b
    per = max(count, 1)
    result = {
        "label": label, "objects": count,
        "rss_mb": round((meta_b["rss_kb"] - meta_a["rss_kb"]) / 1024, 1),
        "rss_gc_mb": round((meta_b["rss_gc_kb"] - meta_a["rss_gc_kb"]) / 1024, 1),
        "rss_trimmed_mb": round((meta_b["rss_trimmed_kb"] - meta_a["rss_trimmed_kb"]) / 1024, 1),
        "traced_mb": round((meta_b["traced"] - meta_a["traced"]) / 2**20, 2),
        "traced_bytes_per_object": round((meta_b["traced"] - meta_a["traced"]) / per),
    }
    print(f"\n== {label}: {count} objects")
    print(f"RSS {result['rss_mb']:+} MB (after gc: {result['rss_gc_mb']:+} MB, then malloc_trim: "
          f"{result['rss_trimmed_mb']:+} MB; absolute {meta_b['rss_trimmed_kb'] / 1024:.1f} MB, "
          f"high-water {meta_b['hwm_kb'] / 1024:.1f} MB); "
          f"Python allocations alive {result['traced_mb']:+} MB = {result['traced_bytes_per_object']} B/object")
    arenas = {key: (meta_b["pymalloc"].get(key, 0) - meta_a["pymalloc"].get(key, 0)) / 2**20
              for key in ("bytes in allocated blocks", "arenas allocated current")}
    result["pymalloc_blocks_mb"] = round(arenas["bytes in allocated blocks"], 1)
    result["pymalloc_arenas_mb"] = round(arenas["arenas allocated current"] * 2**20, 1)  # 1 MiB arenas
    print(f"pymalloc: arenas {result['pymalloc_arenas_mb']:+} MB, of which small objects alive "
          f"{result['pymalloc_blocks_mb']:+} MB")
    filters = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
    print(f"-- by line (first frame), bytes per object, top {top}")
    lines = []
    for stat in snap_b.filter_traces(filters).compare_to(snap_a.filter_traces(filters), "lineno")[:top]:
        frame = stat.traceback[0]
        where = f"{frame.filename.split('site-packages/')[-1].replace(str(REPO) + '/', '')}:{frame.lineno}"
        lines.append({"where": where, "bytes_per_object": round(stat.size_diff / per),
                      "blocks_per_object": round(stat.count_diff / per, 2)})
        print(f"{stat.size_diff / per:9.0f} B {stat.count_diff / per:6.2f} blocks  {where}")
    result["by_line"] = lines
    print(f"-- gc-tracked objects by type, per object (>= 0.05), top {top}")
    diff = {t: (meta_b["types"].get(t, 0) - meta_a["types"].get(t, 0)) / per
            for t in set(meta_a["types"]) | set(meta_b["types"])}
    types = sorted(((t, d) for t, d in diff.items() if abs(d) >= 0.05), key=lambda x: -abs(x[1]))[:top]
    for name, d in types:
        print(f"{d:8.2f}  {name}")
    result["types_per_object"] = dict(types)
    return result


async def converged(kube: Kube, namespace: str, count: int, probe: Probe, timeout: float = 600) -> None:
    """Until every ImmortalContainer counts its first start; fails if the operator exits or stalls."""
    path = f"/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/{namespace}/immortalcontainers"
    deadline = time.monotonic() + timeout
    while True:
        items = (await kube.get(path))["items"]
        started = sum(1 for item in items if (item.get("status") or {}).get("startTimes"))
        if started >= count:
            return
        if probe.proc.poll() is not None:
            raise RuntimeError(f"the operator exited ({probe.proc.returncode}); see {probe.outdir}/operator.log")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{started} of {count} ImmortalContainers started after {timeout} s")
        await asyncio.sleep(2)


async def main_async(args: argparse.Namespace) -> None:
    kubeconfig = Path(os.environ.get("CLUSTER_DIR", REPO / ".cluster")) / "kubeconfig"
    subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "apply", "--server-side", "-f",
                    str(REPO / "manifests/crds/")], check=True, capture_output=True)
    files = args.operators or sorted(str(p) for p in (REPO / "operators").glob("*.py"))
    outdir = Path(args.outdir)
    probe = Probe(outdir, files, kubeconfig)
    kube = Kube(kubeconfig)
    ns = f"memprobe-{uuid.uuid4().hex[:6]}"
    results = []
    try:
        await asyncio.sleep(5)
        await probe.settle()
        base = await probe.snapshot()
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        pod_body: dict[str, Any] = {"metadata": {"labels": {"app": "unrelated"}},
                    "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "c", "image": "busybox:1.36"}]}}

        async def create(path: str, body: dict[str, Any]) -> None:
            await kube.request("POST", path, body)

        jobs = [create(f"/api/v1/namespaces/{ns}/configmaps",
                       {"metadata": {"name": f"cm-{j}"}, "data": {"key": f"value-{j}" * 8}})
                for j in range(args.configmaps)]
        jobs += [create(f"/api/v1/namespaces/{ns}/secrets",
                        {"metadata": {"name": f"s-{j}"}, "stringData": {"key": f"value-{j}" * 8}})
                 for j in range(args.secrets)]
        jobs += [create(f"/api/v1/namespaces/{ns}/pods", {**pod_body, "metadata": {**pod_body["metadata"],
                                                                                   "name": f"p-{j}"}})
                 for j in range(args.pods)]
        jobs += [create(f"/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/{ns}/immortalcontainers",
                        {"apiVersion": "immortalcontainer.flugel.it/v1alpha1", "kind": "ImmortalContainer",
                         "metadata": {"name": f"ic-{j}"}, "spec": {"image": "busybox:1.36"}})
                 for j in range(args.ics)]
        started = time.monotonic()
        await bounded(64, jobs)
        print(f"created {len(jobs)} objects in {time.monotonic() - started:.1f} s", flush=True)
        if args.ics:  # a figure from an operator that does not work would be meaningless
            await converged(kube, ns, args.ics, probe)
        await asyncio.sleep(5)
        await probe.settle()
        loaded = await probe.snapshot()
        count = args.configmaps + args.secrets + args.pods + args.ics
        results.append(report("created, at rest (vs. before)", count, base, loaded, args.top))
        if not args.keep:
            await kube.request("DELETE", f"/api/v1/namespaces/{ns}")
            while await kube.request("GET", f"/api/v1/namespaces/{ns}", ok_missing=True) is not None:
                await asyncio.sleep(2)
            await asyncio.sleep(5)
            await probe.settle()
            deleted = await probe.snapshot()
            results.append(report("deleted again (vs. before)", count, base, deleted, args.top))
        (outdir / "report.json").write_text(json.dumps(results, indent=1))
    finally:
        probe.stop()
        await kube.close()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(Path(sys.argv[2]), sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configmaps", type=int, default=2500)
    parser.add_argument("--secrets", type=int, default=2500)
    parser.add_argument("--pods", type=int, default=0, help="unrelated pods (on kwok-node-0)")
    parser.add_argument("--ics", type=int, default=0, help="ImmortalContainers (each gets its pod)")
    parser.add_argument("--operators", nargs="*", help="operator files (default: operators/*.py)")
    parser.add_argument("--outdir", default="/tmp/mem-probe")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--keep", action="store_true", help="keep the objects (no third snapshot)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
