"""Benchmarks of the operator process against the local control plane, each next to its floor (and its
Go peer where there is one).

    .venv/bin/python -m bench.run                       # full run -> .bench/results.{json,md} (git-ignored)
    .venv/bin/python -m bench.run --quick               # small counts -> .bench/results-quick.{json,md}
    .venv/bin/python -m bench.run --quick --only scale quiet_logs
    .venv/bin/python -m bench.run --operators operators/immortal.py   # load only these operator files
    .venv/bin/python -m bench.run --only scale --set scale_pods=0,10000,20000     # override a count
    .venv/bin/python -m bench.run --render .bench/results.json         # re-render the markdown only

Honours CLUSTER_DIR (the cluster is started if needed) and OPERATOR_FILES (as --operators). The operator
runs as in the Helm chart's default (``kopf-operators run --standalone --all-namespaces <files>``, log
level info), under a ServiceAccount token so that the API server's audit log counts its requests; the
floors (bench/floor.py) run as separate processes with the admin credentials. Sections of operators that
are not loaded are recorded as skipped. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench import sections
from bench.harness import FULL, QUICK, Bench, log, operator_files
from bench.report import render
from testsupport.paths import REPO


async def timed_section(b: Bench, name: str) -> None:
    log(f"== {name}")
    started = time.monotonic()
    try:
        b.results[name] = await sections.get(name)(b)
    except Exception as exc:  # one broken section must not lose the others' figures
        import traceback
        log(f"  {name} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        b.results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    b.results.setdefault(name, {})["section_seconds"] = round(time.monotonic() - started, 1)
    log(f"  {name}: {json.dumps(b.results[name])[:600]}")


async def main_async(b: Bench, quick: bool) -> dict[str, Any]:
    started = time.monotonic()
    await b.setup()
    b.start_operator()
    try:
        for name in sections.SECTIONS:
            if name not in b.sections:
                continue
            if name == "reroller_latency_defaults" and b.operator and b.operator.proc:
                mem = b.operator.status()  # after latency and convergence, before the restarts
                b.results["rss_after_sections"] = {"rss_mb": round(mem["VmRSS"] / 1024, 1),
                                                   "hwm_mb": round(mem["VmHWM"] / 1024, 1)}
            await timed_section(b, name)
    finally:
        b.stop_operator()
        if b.namespaces:
            await b.cleanup(list(b.namespaces), wait=120)
        await b.kube.close()
    b.results["meta"] = {
        "run": b.run, "counts": b.n, "quick": quick, "sections": b.sections,
        "total_seconds": round(time.monotonic() - started, 1),
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}", "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "operator_files": b.files,
        "operator_root": str(b.root),
        "operator": f"kopf-operators run --standalone --all-namespaces {' '.join(b.files)} (log level info) as a "
                    "cluster-admin ServiceAccount; latency and convergence run with REROLLER_DEBOUNCE_SECONDS=0 "
                    "REROLLER_MIN_INTERVAL_SECONDS=0 REROLLER_CLUSTER_ROLLOUTS_PER_SECOND=0",
    }
    return b.results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts; results to .bench/results-quick.*")
    parser.add_argument("--only", nargs="*", choices=list(sections.SECTIONS), metavar="SECTION",
                        help=f"run only these sections ({', '.join(sections.SECTIONS)})")
    parser.add_argument("--operators", help="operator files to load, comma or space separated "
                                            "(default: $OPERATOR_FILES, else operators/*.py)")
    parser.add_argument("--operator-root", metavar="DIR",
                        help="run the operator from another checkout (its operators/, kopf_operators/ and CRDs), "
                             "e.g. to compare two revisions with the same harness")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a count, e.g. --set events=50 --set scale_pods=0,10000,20000")
    parser.add_argument("--output", help="results file prefix (default .bench/results or .bench/results-quick)")
    parser.add_argument("--render", metavar="JSON", help="only re-render the markdown of a results JSON file")
    args = parser.parse_args()
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
        print(path.with_suffix(".md").read_text())
        return
    counts = dict(QUICK if args.quick else FULL)
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in counts:
            parser.error(f"--set {item}: no count named {key!r} (one of {', '.join(counts)})")
        counts[key] = [int(v) for v in value.split(",")] if isinstance(counts[key], list) else int(value)
    root = Path(args.operator_root).resolve() if args.operator_root else REPO
    bench = Bench(counts, args.only or list(sections.SECTIONS), operator_files(args.operators, root), root)
    results = asyncio.run(main_async(bench, args.quick))
    # Results stay out of the source tree: bench/ holds only code (raw runs worth keeping go to the
    # bench-results branch).
    prefix = Path(args.output) if args.output else REPO / ".bench" / ("results-quick" if args.quick else "results")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    prefix.with_suffix(".md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
