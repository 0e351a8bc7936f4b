"""Does `pip install agent-rl[EXTRA]` resolve on each supported Python? Asked of pip's own
resolver, from any host (no GPU, no such Python needed): binary wheels only, for x86-64 Linux
(manylinux), as a GPU machine would install them.

python scripts/check_install.py [--extras gpu gpu-torch] [--pythons 3.11 3.12 3.13] [--if-changed]

Prints one row per (Python, extra): resolved or not, and the vLLM / torch / faiss versions it
chose. Exit code 0 when every one resolved and requires-python admits every Python asked, 1
when one did not, 3 when the package index could not be reached, kept breaking off a download or
the disk could not hold pip's downloads (a row left unchecked; where another row failed outright, 1).

A full run of the default extras and Pythons that resolves writes scripts/gpu_extras_resolved.json:
its rows and a key of what decides them (requires-python, the dependencies and extras, this
script). `--if-changed` (what the test suite runs) asks the index only when that key differs
from the recorded one; otherwise it reports the recorded rows. It does not notice the index
changing under unchanged requirements: run it without --if-changed for that.

pip downloads the wheels it resolves (about 4 GB for a CUDA torch and vLLM's NVIDIA libraries,
in TMPDIR, while it runs): as many resolutions run at once as the free space holds, and one that
ran out of space is tried again alone.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = [f"manylinux_2_{i}_x86_64" for i in range(39, 4, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64",
                                                                      "linux_x86_64"]
SHOWN = ("vllm", "torch", "faiss-gpu-cu12", "faiss-cpu")
UNREACHABLE = ("NewConnectionError", "Max retries exceeded", "Failed to establish a new connection",
               "Temporary failure in name resolution", "Network is unreachable")
# a download that broke off and was resumed into a file whose hash no longer matches the index's:
# the transport failed, not the resolution (tried again; if it keeps happening, nothing was checked)
INTERRUPTED = ("Connection interrupted while downloading", "DO NOT MATCH THE HASHES")
NO_SPACE = "No space left on device"
TRANSIENT = ("interrupted", "no space")
RESOLVED = ROOT / "scripts" / "gpu_extras_resolved.json"
"""The last full resolution that passed: {"key", "date", "rows"} (module doc)."""
DEFAULT_EXTRAS = ["gpu", "gpu-torch"]
DEFAULT_PYTHONS = ["3.11", "3.12", "3.13"]
"""Failures of the host, not of the resolution: tried again, one at a time, RETRIES times."""
RETRIES = 2
DISK_PER_RESOLUTION = 6 << 30
"""Free bytes one resolution may need in TMPDIR (4 GB seen for an extra with vLLM, and a margin)."""


def failure(stderr: str) -> str:
    """Why pip failed: 'unreachable' (no index), 'no space' (the disk filled with its downloads),
    'interrupted' (a download broke off) or 'failed'."""
    if any(m in stderr for m in UNREACHABLE):
        return "unreachable"
    if NO_SPACE in stderr:
        return "no space"
    return "interrupted" if all(m in stderr for m in INTERRUPTED) else "failed"


def requirements(extra: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    if extra not in extras:
        raise SystemExit(f"no extra {extra!r} in pyproject.toml (has: {', '.join(extras)})")
    return list(project["dependencies"]) + list(extras[extra])


def inputs_key(extras: list[str] = DEFAULT_EXTRAS) -> str:
    """sha256 of what decides the resolution: requires-python, the dependencies, the extras asked
    and this script (its platforms and pip flags)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    decided = {"requires-python": project["requires-python"], "dependencies": project["dependencies"],
               "extras": {e: project["optional-dependencies"].get(e) for e in sorted(extras)},
               "script": Path(__file__).read_text()}
    return hashlib.sha256(json.dumps(decided, sort_keys=True).encode()).hexdigest()


def recorded_rows(path: Path | None = None) -> list[dict] | None:
    """The recorded resolution's rows (of RESOLVED unless `path`) when its key is today's and
    every row passed, else None."""
    path = RESOLVED if path is None else path
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    rows = record.get("rows") if isinstance(record, dict) else None
    if record.get("key") != inputs_key() or not rows:
        return None
    if not all(r.get("result") == "ok" and r.get("admitted") for r in rows):
        return None
    print(f"[check_install] requirements unchanged since the resolution recorded on {record.get('date')} "
          f"({path}): the index is not asked again", file=sys.stderr)
    return rows


def admits(python: str) -> bool:
    from packaging.specifiers import SpecifierSet

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    return SpecifierSet(spec).contains(f"{python}.0")


def workers(n: int, free: int | None = None) -> int:
    """How many of n resolutions run at once: as many as TMPDIR's free space holds, at least one."""
    free = shutil.disk_usage(tempfile.gettempdir()).free if free is None else free
    return max(1, min(n, free // DISK_PER_RESOLUTION))


def resolve(reqs: list[str], python: str) -> tuple[str, dict[str, str], str]:
    """('ok' | 'failed' | 'unreachable', chosen versions, pip's last lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "--python-version", python, "--implementation", "cp",
               "--only-binary=:all:", *(a for p in PLATFORMS for a in ("--platform", p)), *reqs]
        # the machine's own constraints (a local torch cap) do not apply to another host's install
        env = {**os.environ, "PIP_CONSTRAINT": ""}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        tail = "\n".join(line for line in proc.stderr.splitlines() if "is ignored" not in line)[-1500:]
        if proc.returncode != 0:
            return failure(proc.stderr), {}, tail
        chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
        return "ok", {k: v for k, v in chosen.items() if k in SHOWN}, tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extras", nargs="+", default=DEFAULT_EXTRAS)
    ap.add_argument("--pythons", nargs="+", default=DEFAULT_PYTHONS)
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--if-changed", action="store_true",
                    help=f"ask the index only when the requirements differ from {RESOLVED.name}'s")
    args = ap.parse_args(argv)
    full = args.extras == DEFAULT_EXTRAS and args.pythons == DEFAULT_PYTHONS
    if args.if_changed and full:
        rows = recorded_rows()
        if rows is not None:
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
            return 0
    rows, status = [], 0
    print("| Python | extra | requires-python | resolves | versions chosen |")
    print("|---|---|---|---|---|")
    # the resolutions are independent and each waits on the index about half its time: as many at
    # once as the disk holds (rows in order)
    combos = list(itertools.product(args.pythons, args.extras))
    reqs = {extra: requirements(extra) for extra in args.extras}  # an unknown extra stops here, before pip
    with ThreadPoolExecutor(max_workers=workers(len(combos))) as pool:
        results = list(pool.map(resolve, [reqs[extra] for _, extra in combos], [py for py, _ in combos]))
    for i, (py, extra) in enumerate(combos):  # broken downloads or a full disk: again, one at a time
        for _ in range(RETRIES):
            if results[i][0] not in TRANSIENT:
                break
            why = "a download broke off" if results[i][0] == "interrupted" else "the disk filled"
            print(f"[check_install] {py} {extra}: {why}; resolving again alone", file=sys.stderr)
            results[i] = resolve(reqs[extra], py)
    unchecked = None
    for (py, extra), (result, chosen, tail) in zip(combos, results):
        row = {"python": py, "extra": extra, "admitted": admits(py), "result": result, "chosen": chosen}
        rows.append(row)
        print(f"| {py} | {extra} | {'yes' if row['admitted'] else 'NO'} | {result} | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(chosen.items()))} |", flush=True)
        if result == "unreachable" or result in TRANSIENT:
            unchecked = unchecked or (result, tail)
        elif result != "ok" or not row["admitted"]:
            status = 1
            print(tail, file=sys.stderr)
    if unchecked and not status:  # a resolution that failed outright is reported as such
        why = {"unreachable": "the package index is unreachable",
               "interrupted": f"the package index kept breaking off downloads ({RETRIES + 1} tries)",
               "no space": f"TMPDIR could not hold pip's downloads, even alone ({RETRIES + 1} tries)"}[unchecked[0]]
        print(f"{why}: not everything was checked\n{unchecked[1]}", file=sys.stderr)
        return 3
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if full and status == 0:
        RESOLVED.write_text(json.dumps({"key": inputs_key(), "date": datetime.date.today().isoformat(), "rows": rows},
                                       indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
