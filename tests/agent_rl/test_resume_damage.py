"""Property tests: no damaged state on disk makes a resume crash, lose work silently, or touch
files the job did not write.

Real checkpoints, rollouts.json files, metrics logs and demo workdirs are made with the
project's own writers, then damaged the ways a kill, a power loss, a full disk or a person
leaves them: files truncated at any byte, emptied, replaced by garbage or by a directory, a
manifest missing or lying, a state of the wrong type, a checkpoint under another step's name,
names near the manager's own, NUL bytes and undecodable lines in the metrics log, a stage's
output without its completion marker. The promises checked:

- the resume path takes the newest complete checkpoint and says which one it skipped and why,
  or fails with a ValueError / FileNotFoundError naming the file, never another exception;
- saving, pruning and clearing a killed save leave every file the manager did not write;
- the metrics rows a run logged up to its checkpoint survive the resume, unchanged, in order.

Examples are bounded so the module runs in seconds on two cores (no model, tiny tensors).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent_rl.training.checkpoint import MANIFEST, STATE, CheckpointManager, manifest_of

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])


# ----------------------------------------------------------------------------- checkpoints
def _save(mgr: CheckpointManager, step: int) -> Path:
    """A checkpoint as the trainer saves one: a worker's files, the driver's state and RNG."""
    def workers(d: Path) -> None:
        (d / "actor").mkdir()
        (d / "actor" / "weights.pt").write_bytes(b"w" * 64 + bytes([step]))
        torch.save({"w": torch.full((4,), float(step))}, d / "actor" / "state.pt")

    return mgr.save(step, {"data": {"epoch": 0, "index": step}, "kl_ctrl": {}}, {"lr": 1e-6}, workers)


def _remanifest(path: Path) -> None:
    """Make the manifest match the files as they are now: a state rewritten whole by someone,
    which the size check cannot see (load must then name the file at fault)."""
    (path / MANIFEST).write_text(json.dumps(manifest_of(path)))


def _files(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


DAMAGE = ("truncate", "empty", "garbage same size", "garbage", "directory", "remove", "remove manifest",
          "manifest lies")


def _break(path: Path, rel: str, how: str, cut: float, noise: bytes) -> None:
    """Damage file `rel` of checkpoint `path` (`cut`: where in the file, 0..1)."""
    f = path / rel
    data = f.read_bytes()
    if how == "truncate":
        f.write_bytes(data[: int(cut * (len(data) - 1))])
    elif how == "empty":
        f.write_bytes(b"")
    elif how == "garbage same size":
        f.write_bytes((noise * (len(data) // max(1, len(noise)) + 1))[: len(data)] if noise else data)
    elif how == "garbage":
        f.write_bytes(noise)
    elif how == "directory":
        f.unlink()
        f.mkdir()
    elif how == "remove":
        f.unlink()
    elif how == "remove manifest":
        (path / MANIFEST).unlink()
        f.write_bytes(data[: int(cut * (len(data) - 1))])
    elif how == "manifest lies":
        manifest = json.loads((path / MANIFEST).read_text())
        manifest[rel] = manifest.get(rel, 0) + 1 + int(cut * 100)
        (path / MANIFEST).write_text(json.dumps(manifest))


def _check_resume(mgr: CheckpointManager) -> tuple[Path | None, dict | None, str | None]:
    """(the checkpoint `latest()` chose, its state, or the refusal's message): the only
    exceptions a resume may raise are ValueError and FileNotFoundError, naming a file."""
    path = mgr.latest()
    if path is None:
        return None, None, None
    try:
        state = mgr.load(path)
    except (ValueError, FileNotFoundError) as e:
        assert str(path) in str(e), e
        return path, None, str(e)
    return path, state, None


@FUZZ
@given(how=st.sampled_from(DAMAGE), pick=st.integers(0, 100), cut=st.floats(0, 1), noise=st.binary(max_size=300))
@example(how="garbage same size", pick=100, cut=0.0, noise=b"\x80")  # torch's unpickler: IndexError
@example(how="garbage same size", pick=100, cut=0.0, noise=b"\x81")  # ...from another line of it
def test_any_damage_to_the_newest_checkpoint_falls_back_or_is_refused_by_name(tmp_path_factory, capsys, how, pick,
                                                                              cut, noise):
    root = tmp_path_factory.mktemp("run") / "checkpoints"
    mgr = CheckpointManager(root)
    first, newest = _save(mgr, 1), _save(mgr, 2)
    rels = _files(newest)
    rel = rels[pick % len(rels)]
    _break(newest, rel, how, cut, noise)
    capsys.readouterr()
    path, state, refused = _check_resume(mgr)
    out = capsys.readouterr().out
    assert path in (first, newest)
    if path == first:  # the fallback is said, with the reason
        assert f"[checkpoint] skipping {newest}: " in out and state is not None and state["step"] == 1
    elif state is not None:
        assert state["step"] == 2 and isinstance(state["data"], dict)
    else:
        assert refused is not None and "Traceback" not in refused
    sized = how in ("truncate", "empty", "directory", "remove", "manifest lies")
    if sized and not (rel == MANIFEST and how == "remove"):
        assert path == first  # a file that is not what the manifest recorded is found before loading


@pytest.mark.parametrize("manifest", ["[]", "null", '"rng.pt"', '{"rng.pt": "1024"}', '{"rng.pt": null}'],
                         ids=["list", "null", "string", "size_text", "size_null"])
def test_a_manifest_that_is_not_a_map_of_sizes_is_skipped_not_a_crash(tmp_path, capsys, manifest):
    """A manifest of the wrong shape made latest() raise AttributeError: the resume path crashed
    with a raw traceback instead of falling back to the checkpoint before."""
    mgr = CheckpointManager(tmp_path)
    first, newest = _save(mgr, 1), _save(mgr, 2)
    (newest / MANIFEST).write_text(manifest)
    assert mgr.latest() == first
    assert f"skipping {newest}: {MANIFEST}" in capsys.readouterr().out
    with pytest.raises(ValueError, match=f"{newest} is damaged: {MANIFEST}"):
        mgr.load(newest)


@pytest.mark.parametrize("state, why", [
    ("[]", "is not an object with an integer step"), ("null", "is not an object with an integer step"),
    ('{"data": {"index": 2}}', "is not an object with an integer step"),
    ('{"step": "2"}', "is not an object with an integer step"),
    ('{"step": true}', "is not an object with an integer step"), ('{"step": 7, "data": {}}', "is step 7, not 2"),
], ids=["list", "null", "no_step", "step_text", "step_bool", "other_step"])
def test_a_trainer_state_of_the_wrong_shape_is_skipped_and_refused_by_name(tmp_path, capsys, state, why):
    """trainer_state.json that parses to a list, null, an object without an integer step (or
    another step than its directory's) counted as complete: latest() chose it and the resume
    crashed on state["step"] (TypeError, KeyError), or resumed at the wrong step."""
    mgr = CheckpointManager(tmp_path)
    first, newest = _save(mgr, 1), _save(mgr, 2)
    (newest / STATE).write_text(state)
    _remanifest(newest)
    assert mgr.latest() == first and f"skipping {newest}: {STATE} {why}" in capsys.readouterr().out
    with pytest.raises(ValueError, match=re.escape(f"{newest} is damaged: {STATE} {why}")):
        mgr.load(newest)
    if "integer step" in why:  # finished_run reads it alone (trainer.resume_from_path too)
        with pytest.raises(ValueError, match=re.escape(f"{newest / STATE} {why}")):
            CheckpointManager.read_state(newest)


def test_a_checkpoint_copied_under_a_later_steps_name_is_not_resumed(tmp_path, capsys):
    """A copy of step 2 as `global_step_999` (a backup, a hand edit) was the newest forever:
    every resume went back to step 2, and the work saved after it was never resumed."""
    mgr = CheckpointManager(tmp_path, keep=2)
    _save(mgr, 1)
    shutil.copytree(_save(mgr, 2), tmp_path / "global_step_999")
    newest = _save(mgr, 3)
    assert mgr.latest() == newest and mgr.load(newest)["step"] == 3
    assert f"skipping {tmp_path / 'global_step_999'}: {STATE} is step 2, not 999" in capsys.readouterr().out


@pytest.mark.parametrize("rng", [[1, 2], None, {"python": 1},
                                 {"python": (3, (1,) * 625, None), "numpy": 0, "torch": 0}],
                         ids=["list", "none", "missing_keys", "wrong_values"])
def test_rng_state_of_the_wrong_shape_is_refused_naming_the_file(tmp_path, rng):
    """rng.pt that unpickles to a list, None, or a dict without the right states raised
    TypeError / KeyError from set_rng_state: a raw traceback that named no file."""
    mgr = CheckpointManager(tmp_path)
    path = _save(mgr, 1)
    torch.save(rng, path / "rng.pt")
    _remanifest(path)
    with pytest.raises(ValueError, match=re.escape(f"{path / 'rng.pt'}")):
        mgr.load(path)


@FUZZ
@given(cut=st.floats(0, 0.99))
def test_a_short_rng_file_in_a_checkpoint_without_manifest_is_refused_by_name(tmp_path_factory, cut):
    """A checkpoint saved before manifests cannot be size-checked: a truncated or empty rng.pt
    raised RuntimeError ("PytorchStreamReader failed ...") or a bare EOFError naming no file."""
    mgr = CheckpointManager(tmp_path_factory.mktemp("run"))
    path = _save(mgr, 1)
    (path / MANIFEST).unlink()
    rng = path / "rng.pt"
    rng.write_bytes(rng.read_bytes()[: int(cut * rng.stat().st_size)])
    assert mgr.latest() == path  # complete as far as can be told
    with pytest.raises(ValueError, match=re.escape(f"{rng}")):
        mgr.load(path)


STRANGERS = {
    ".global_step_backup.old": "dir", "global_step_notes.tmp": "dir", "global_step_01": "dir", "global_step_-1": "dir",
    "global_step_2.bak": "dir", ".latest.mine.tmp": "file", "notes.txt": "file", "global_step_x": "file",
}
"""Names near the manager's own that it never writes: none of them is its to remove."""


def test_saving_pruning_and_clearing_a_killed_save_leave_a_strangers_files(tmp_path):
    """`.global_step_*.old` and `global_step_*.tmp` were matched by glob alone and removed
    whatever followed the prefix, and `global_step_01` counted as step 1 and was pruned."""
    for name, kind in STRANGERS.items():
        p = tmp_path / name
        if kind == "dir":
            p.mkdir()
            (p / "mine.txt").write_text(name)
        else:
            p.write_text(name)
    shutil.copytree(tmp_path / "global_step_01", tmp_path / "global_step_01_copy")
    mgr = CheckpointManager(tmp_path, keep=1)
    for step in (1, 2, 3, 2):  # a step saved again: the swap and its aside
        _save(mgr, step)
    for name, kind in STRANGERS.items():
        p = tmp_path / name
        assert (p / "mine.txt" if kind == "dir" else p).read_text() == name, name
    assert mgr.latest().name == "global_step_3"
    assert sorted(p.name for p in tmp_path.glob("global_step_[0-9]")) == ["global_step_2", "global_step_3"]


def test_a_symlinked_step_outside_the_run_is_never_emptied(tmp_path):
    """A step directory that is a link to a directory elsewhere: pruning removes the link's
    target never (rmtree refuses links), and what it points at keeps every file."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"x" * 10)
    mgr = CheckpointManager(tmp_path / "ckpt", keep=1)
    _save(mgr, 1)
    (tmp_path / "ckpt" / "global_step_0").symlink_to(outside, target_is_directory=True)
    _save(mgr, 2)
    _save(mgr, 3)
    assert (outside / "precious.bin").read_bytes() == b"x" * 10
    assert mgr.latest().name == "global_step_3"


@FUZZ
@given(broken=st.lists(st.booleans(), min_size=1, max_size=5), hows=st.lists(st.sampled_from(
    ("truncate", "empty", "directory", "remove", "manifest lies")), min_size=5, max_size=5),
       picks=st.lists(st.integers(0, 100), min_size=5, max_size=5))
def test_pruning_never_leaves_nothing_to_resume_from(tmp_path_factory, broken, hows, picks):
    """keep=2, some checkpoints damaged after they were saved: the newest complete one is kept
    (a damaged one never counts towards keep) and resumed."""
    root = tmp_path_factory.mktemp("run")
    mgr = CheckpointManager(root, keep=2)
    _save(mgr, 1)
    for step, (bad, how, pick) in enumerate(zip(broken, hows, picks), start=2):
        path = _save(mgr, step)
        if bad:
            rels = [r for r in _files(path) if r != MANIFEST]
            _break(path, rels[pick % len(rels)], how, 0.5, b"")
    newest_complete = max([1] + [step for step, bad in enumerate(broken, start=2) if not bad])
    path, state, refused = _check_resume(mgr)
    assert path == root / f"global_step_{newest_complete}" and state["step"] == newest_complete and refused is None


# ----------------------------------------------------------------------------- rollouts.json
def _rollouts(n: int = 4, groups: int = 2) -> dict:
    """rollouts.json as `AheadCollector.state` writes it: groups with a finished member, one
    in flight and the rest not started."""
    from agent_rl.rollout.manager import _State
    from agent_rl.rollout.stream import SavedGroup
    from agent_rl.training.data import Prompt
    from agent_rl.types import Trajectory

    done = Trajectory([1, 2], [5, 6, 7], [1, 0, 1], [-0.1, 0.0, -0.3], policy_versions=[0, -1, 0])
    live = _State([1, 2], [5, 6], [1, 1], [-0.1, -0.2], [0, 0], [("sampled", "ab")], turns=1)
    saved = [SavedGroup(k, Prompt(f"p{k}", f"q{k}", ["x"]), [done], [live], n - 2) for k in range(groups)]
    return {"next_key": groups, "groups": [g.to_dict() for g in saved]}


class _Worker:
    """The rollout worker's stream, as `AheadCollector` calls it (get: the identity)."""

    def __init__(self) -> None:
        self.submitted: list = []
        self.stream_submit = SimpleNamespace(remote=self.submitted.extend)


def _restore(state: dict) -> list:
    """What a resume does with a checkpoint's rollouts: AheadCollector.restore."""
    from agent_rl.config import TrainConfig, load_config
    from agent_rl.training.collect import make_collector

    cfg = load_config(TrainConfig, None, ["trainer.mode=async", "actor_rollout_ref.actor.tis_cap=2",
                                          "actor_rollout_ref.rollout.n=4"])
    worker = _Worker()
    make_collector(worker, None, cfg, 10, get=lambda x: x).restore(state)
    return worker.submitted


def _bad_key(s: dict) -> None:
    s["groups"][1]["key"] = "one"


@pytest.mark.parametrize("edit, said", [
    (lambda s: s["groups"][1].update(prompt=["p1"]), "groups[1].prompt"),
    (lambda s: s["groups"][1]["prompt"].pop("id"), "groups[1].prompt"),
    (lambda s: s["groups"][1]["prompt"].update(extra=1), "groups[1].prompt"),
    (lambda s: s["groups"][1]["done"][0].update(extra=1), "groups[1]"),
    (lambda s: s["groups"][1]["live"][0].update(segments=5), "groups[1]"),
    (lambda s: s["groups"][1]["live"][0].update(extra=1), "groups[1]"),
    (_bad_key, "groups[1].key"),
    (lambda s: s["groups"][1].update(key=0), "groups[1].key 0 is also groups[0]'s"),
    (lambda s: s.update(next_key="2"), "next_key"),
    (lambda s: s.update(next_key=None), "next_key"),
    (lambda s: s.update(next_key=1), "next_key 1 is not past groups[1].key 1"),
], ids=["prompt_list", "prompt_no_id", "prompt_extra", "done_extra", "live_segments", "live_extra", "key_text",
        "key_twice", "next_key_text", "next_key_null", "next_key_behind"])
def test_rollouts_that_cannot_be_restored_are_refused_when_read(tmp_path, edit, said):
    """read_rollouts (run before Ray and the engine start) passed groups whose prompt or
    trajectories did not fit their types, and keys that collide: the resume then crashed in
    restore() with a raw TypeError after everything had started, or the next prompts took
    the keys of groups in flight (the stream keeps one group per key: one was lost)."""
    from agent_rl.training.collect import read_rollouts

    state = _rollouts()
    _restore(copy.deepcopy(state))  # the file as written restores
    edit(state)
    path = tmp_path / "rollouts.json"
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=re.escape(f"{path}: {said}")):
        read_rollouts(path, 4)


@FUZZ
@given(cut=st.floats(0, 0.999), noise=st.binary(max_size=40), at=st.floats(0, 1))
def test_rollouts_truncated_or_garbled_anywhere_are_refused_by_name_or_restore_whole(tmp_path_factory, cut, noise, at):
    from agent_rl.training.collect import read_rollouts

    state = _rollouts()
    full = json.dumps(state).encode()
    path = tmp_path_factory.mktemp("ckpt") / "rollouts.json"
    for data in (full[: int(cut * len(full))], full[: int(at * len(full))] + noise + full[int(at * len(full)):]):
        path.write_bytes(data)
        try:
            read = read_rollouts(path, 4)
        except ValueError as e:
            assert str(path) in str(e)
            continue
        submitted = _restore(read)  # what read_rollouts passed restores, every group
        assert [k for k, _, _ in submitted] == [g["key"] for g in read["groups"]]


# ----------------------------------------------------------------------------- metrics.jsonl
def _logged(run_dir: Path, steps) -> list[dict]:
    from agent_rl.training.metrics import MetricsLogger, read_jsonl

    log = MetricsLogger(run_dir, ["jsonl"])
    for step in steps:
        log.log({"reward/mean": step / 10, "timing/step": 1.5}, step, extra={"prompt_ids": [f"p{step}"]})
    log.close()
    return read_jsonl(run_dir)


JSONL_DAMAGE = {
    "partial last line": lambda line, noise: line[: len(line) // 2],
    "NUL bytes": lambda line, noise: b"\0" * (1 + len(noise)) + line,
    "NUL block (power loss)": lambda line, noise: b"\0" * len(line),
    "not UTF-8": lambda line, noise: line[:-1] + b"\xff\xfe" + noise.replace(b"\n", b"") + b"}",
    "garbage": lambda line, noise: b"\xfe" + noise.replace(b"\n", b""),
}


@FUZZ
@given(kind=st.sampled_from(sorted(JSONL_DAMAGE)), which=st.integers(0, 5), resume=st.integers(0, 6),
       noise=st.binary(max_size=40))
def test_metrics_logged_up_to_the_checkpoint_survive_a_damaged_log(tmp_path_factory, capsys, kind, which, resume,
                                                                   noise):
    """One line of metrics.jsonl damaged (a kill mid-write, a power loss's NUL block, bytes
    that are not UTF-8): a resume from step `resume` keeps every other row logged up to it,
    unchanged and in order, and appends after them."""
    from agent_rl.training.metrics import MetricsLogger, read_jsonl

    run_dir = tmp_path_factory.mktemp("run")
    rows = _logged(run_dir, range(1, 7))
    path = run_dir / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    broken = which if kind != "partial last line" else len(lines) - 1
    lines[broken] = JSONL_DAMAGE[kind](lines[broken].rstrip(b"\n"), noise) + (b"\n" if broken < len(lines) - 1 else b"")
    path.write_bytes(b"".join(lines))
    log = MetricsLogger(run_dir, ["jsonl"], resume_step=resume)
    log.log({"reward/mean": 9.0}, resume + 1)
    log.close()
    expected = [r for i, r in enumerate(rows) if i != broken and r["step"] <= resume]
    assert read_jsonl(run_dir) == [*expected, {"step": resume + 1, "reward/mean": 9.0}]
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("row", [{"step": "3", "note/x": 1}, {"step": None, "note/x": 1}, {"note/x": 1},
                                 {"step": [3], "note/x": 1}], ids=["step_text", "step_null", "no_step", "step_list"])
def test_a_row_whose_step_is_not_a_number_neither_stops_the_resume_nor_is_dropped(tmp_path, row):
    """A row added by hand or by another tool with a step that is not a number made the
    rewrite on resume raise TypeError ('<=' between str and int); a row without a step was
    dropped as if logged after the checkpoint."""
    from agent_rl.training.metrics import MetricsLogger, read_jsonl

    rows = _logged(tmp_path, (1, 2, 3))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    log = MetricsLogger(tmp_path, ["jsonl"], resume_step=2)
    log.log({"reward/mean": 9.0}, 3)
    log.close()
    assert read_jsonl(tmp_path) == [rows[0], rows[1], row, {"step": 3, "reward/mean": 9.0}]


def test_a_metrics_log_that_is_a_directory_is_named_and_left_alone(tmp_path):
    from agent_rl.training.metrics import MetricsLogger
    from data_prep.io import DataPrepError

    (tmp_path / "metrics.jsonl").mkdir()
    (tmp_path / "metrics.jsonl" / "mine.txt").write_text("x")
    with pytest.raises((ValueError, DataPrepError), match=re.escape(f"{tmp_path / 'metrics.jsonl'}")):
        MetricsLogger(tmp_path, ["jsonl"], resume_step=1)
    assert (tmp_path / "metrics.jsonl" / "mine.txt").read_text() == "x"


# ----------------------------------------------------------------------------- the demo's workdir
def _demo(tmp_path: Path):
    from agent_rl.demo.pipeline import Demo

    args = SimpleNamespace(protocol="search_r1", plain_wording=False, workdir=str(tmp_path / "w"))
    return Demo(args)


def _prepare(demo, monkeypatch) -> list[str]:
    """The stages `Demo.prepare` runs (recorded, not started)."""
    from agent_rl.demo import stages

    ran: list[str] = []
    monkeypatch.setattr(stages, "run_stage", lambda cmd, what, **kw: ran.append(what) or 0.0)
    demo.prepare()
    return ran


def test_finished_stages_are_reused_on_a_rerun(tmp_path, monkeypatch):
    from data_prep.synthetic import generate_kb

    demo = _demo(tmp_path)
    generate_kb(demo.w.kb, seed=0, n_entities=60, n_train=20, n_test=10)
    demo.w.index.mkdir(parents=True)
    (demo.w.index / "meta.json").write_text("{}")
    assert _prepare(demo, monkeypatch) == ["prepare the embedded policy"]  # it skips a complete model itself


@pytest.mark.parametrize("left", ["test.parquet", "test.parquet,train.parquet"], ids=["one", "two"])
def test_a_knowledge_base_without_its_completion_marker_is_not_taken_as_finished(tmp_path, monkeypatch, left):
    """kb/test.parquet alone (a knowledge base copied in by hand, or its other files removed)
    was taken as a finished stage: the index stage then failed on the missing corpus.jsonl, far
    from the cause. The generator's marker, written last, is what says it finished (and the
    generator itself refuses to replace a directory it did not complete)."""
    from data_prep.synthetic import generate_kb

    demo = _demo(tmp_path)
    generate_kb(demo.w.kb, seed=0, n_entities=60, n_train=20, n_test=10)
    for p in demo.w.kb.iterdir():
        if p.name not in left.split(","):
            p.unlink()
    ran = _prepare(demo, monkeypatch)
    assert "generate the knowledge base" in ran and "build the dense index" in ran
    assert sorted(p.name for p in demo.w.kb.iterdir()) == sorted(left.split(","))  # nothing removed here


def test_a_knowledge_base_written_before_the_marker_existed_is_reused(tmp_path, monkeypatch):
    from data_prep.atomic import COMPLETE
    from data_prep.synthetic import generate_kb

    demo = _demo(tmp_path)
    generate_kb(demo.w.kb, seed=0, n_entities=60, n_train=20, n_test=10)
    (demo.w.kb / COMPLETE).unlink()  # every file it writes, but no marker
    assert "generate the knowledge base" not in _prepare(demo, monkeypatch)
