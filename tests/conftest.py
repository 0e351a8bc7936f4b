"""Shared, session-scoped fixtures: the embedded model and the real shared data folder.

Expensive artifacts are built once per test session (the prepared model is cached under
artifacts/ and reused by `make demo`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from data_prep.hardware import no_ray_prestart, passive_threads  # noqa: E402  (standard library only)

# Two workers whose tests start engines, trainers and Ray actors of two OpenMP threads each share
# two cores: a thread that spins while it waits burns the time slice a working one needs. Set
# before torch loads here, and inherited by every process the tests start (Ray's too).
passive_threads()
no_ray_prestart()  # the tests' own Ray nodes too (ray.init, `ray start`)


import heavy  # noqa: E402  (tests/helpers, on pytest's pythonpath)

heavy.install()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads xdist_group into the node ids it schedules by
def pytest_collection_modifyitems(config, items):
    """`slow` by what a test asks for: a fixture that starts an engine, a retriever or Ray, or the
    `ray` mark.

    Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`) the heavy tests run in
    two lanes, each an `xdist_group` that one worker runs test after test: the `ray` lane (the
    tests that start Ray: the `ray` mark or a Ray fixture), so never two Ray clusters at once,
    and the `serial` lane (the rest slow by hand or by an engine fixture, and the `timed` tests),
    whose worker builds the session's engines once and runs no two timed tests together. The
    lanes are moved to the front and are the two largest units, so xdist gives one to each worker
    at once; the other tests (those slow only by a retriever fixture among them) go to whichever
    worker is free. `_slow_mark_is_kept` fails a test outside the lanes that starts Ray or an
    engine, and one outside the ray lane that starts Ray."""
    for item in items:
        fixtures = heavy.HEAVY_FIXTURES & set(getattr(item, "fixturenames", ()))
        marked = item.get_closest_marker("slow") is not None
        ray = item.get_closest_marker("ray") is not None or bool(fixtures & heavy.RAY_FIXTURES)
        heavy_here = marked or ray or bool(fixtures - heavy.RETRIEVER_FIXTURES) or bool(item.get_closest_marker("timed"))
        item.stash[LANE] = RAY_LANE if ray else SERIAL_LANE if heavy_here else None
        if (fixtures or ray) and not marked:
            item.add_marker(pytest.mark.slow)
    if not config.pluginmanager.hasplugin("xdist"):
        return
    lanes = [item for item in items if item.stash[LANE]]
    # in each lane the modules none of whose tests need the prepared model first (a module's
    # tests stay together, so its fixtures are built once): in a clean clone one worker prepares
    # the model (~50 s on one core) while the other runs these instead of waiting for it
    def module(item):
        return item.nodeid.split("::")[0]

    needs_model = {module(item) for item in lanes if "model_dir" in item.fixturenames}
    lanes.sort(key=lambda item: module(item) in needs_model)
    for item in lanes:
        item.add_marker(pytest.mark.xdist_group(item.stash[LANE]))
    in_lane = set(map(id, lanes))
    items[:] = lanes + [item for item in items if id(item) not in in_lane]


RAY_LANE, SERIAL_LANE = "ray", "serial"
"""The xdist groups of the tests that must not share the machine with others of their kind (above)."""
LANE = pytest.StashKey["str | None"]()


@pytest.fixture(autouse=True)
def _slow_mark_is_kept(request):
    """A test not marked slow must not start an engine, a retriever process or Ray (tests/helpers/heavy.py)."""
    before = heavy.STARTS.copy()
    yield
    started = heavy.STARTS - before
    if request.node.get_closest_marker("slow") is None and started:
        pytest.fail(f"started {', '.join(sorted(started))} without the `slow` mark: mark it, or take the fixture "
                    f"that starts it (tests/helpers/heavy.py HEAVY_FIXTURES)", pytrace=False)
    lane = request.node.stash.get(LANE, "unknown")
    outside = sorted(set(started) & heavy.LANE_STARTS)
    if outside and lane is None:
        pytest.fail(f"started {', '.join(outside)} outside make test's lanes (slow only by a retriever fixture): "
                    "mark it `slow` by hand, or `ray` if it starts Ray (tests/conftest.py)", pytrace=False)
    if started[heavy.RAY_SESSION] and lane not in (RAY_LANE, "unknown"):
        pytest.fail("started a Ray session outside make test's ray lane: mark it `ray` (tests/conftest.py)",
                    pytrace=False)


# A full run writes up to ~8 GiB at once (checkpoints of the real 135M policy with its optimizer
# state; pyproject's tmp_path_retention_policy removes each passing test's files).
DISK_NEEDED_GIB = 10


def pytest_report_header(config):
    import shutil
    import tempfile

    free = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    line = f"disk: {free:.0f} GiB free under {tempfile.gettempdir()} (the suite needs ~{DISK_NEEDED_GIB})"
    if free < DISK_NEEDED_GIB:
        pytest.exit(f"{line}: free some space first (old /tmp/pytest-of-* or clones)", returncode=3)
    return line


def shared_data_dir() -> Path | None:
    """../shared/data beside the project (or $AGENT_RL_SHARED_DATA); None when absent."""
    env = os.environ.get("AGENT_RL_SHARED_DATA")
    cand = Path(env) if env else ROOT.parent / "shared" / "data"
    return cand if cand.is_dir() else None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = shared_data_dir()
    if d is None:
        pytest.skip("../shared/data is absent")
    return d


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The embedded policy as an HF directory (prepared once, then reused)."""
    import fcntl

    from data_prep.model import prepare_model

    out = ROOT / "artifacts" / "model"
    out.parent.mkdir(exist_ok=True)
    with open(out.parent / ".model.lock", "w") as lock:  # two xdist workers: one prepares, the other waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        return prepare_model(out)


@pytest.fixture(scope="session")
def tiny_policy(model_dir, tmp_path_factory) -> Path:
    """The embedded policy's first 2 blocks (its real weights, config and tokenizer): the same
    architecture at a fraction of the cost, for tests of code paths rather than of what the
    model knows. Read-only: tests train copies into their own directories."""
    from agent_rl.training.workers import model_io

    return model_io.truncated_copy(model_dir, tmp_path_factory.mktemp("tiny_policy") / "model", num_layers=2)


@pytest.fixture(scope="session")
def tiny_kb(tmp_path_factory):
    """A small generated knowledge base (corpus.jsonl, train/test parquet). Read-only."""
    from data_prep.synthetic import generate_kb

    out = tmp_path_factory.mktemp("kb")
    generate_kb(out, seed=0, n_entities=60)
    return out


@pytest.fixture(scope="session")
def tiny_bm25(tiny_kb, tmp_path_factory):
    """A real BM25 index of tiny_kb (a server loads it without an encoder). Read-only."""
    from data_prep.indexing import build_index

    out = tmp_path_factory.mktemp("bm25") / "index"
    build_index(tiny_kb / "corpus.jsonl", out, kind="bm25", progress=False)
    return out


@pytest.fixture
def small_disk():
    """`run(code, limit)`: run Python `code` in a child process that may write at most `limit`
    bytes per file (RLIMIT_FSIZE, SIGXFSZ ignored), so a write past it raises OSError EFBIG:
    a full disk as the writer sees it. Returns the CompletedProcess (text output)."""

    def run(code: str, limit: int) -> subprocess.CompletedProcess:
        def limit_files() -> None:
            import resource
            import signal

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        return subprocess.run([sys.executable, "-c", code], preexec_fn=limit_files, capture_output=True, text=True,
                              env=env, timeout=300)

    return run
