"""Results are records, documents are references (issue 84): every record in docs/results is
complete and its headline is its JSON's, the tables the documents show are the ones the records
generate today, the README's what-to-expect figures are found in the records they link, and no
result figure is quoted outside those tables."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from agent_rl.demo.records import host_kind, read_record
from benchmarks import records

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/real_data.md", "docs/gpu.md"]
JSON_OF = {"rl_vs_sft": "rl_vs_sft.json", "start_curve": "start_curve.json", "miss_recovery": "miss_recovery.json",
           "gpu_loop": "gpu_loop.json", "vs_trl": "vs_trl.json"}
"""The benchmarks whose headline is computed from their JSON (records.HEADLINES), by the JSON's name."""


def test_every_record_is_complete_and_its_headline_is_its_json():
    recs = records.load_all()
    assert len(recs) >= 20
    for exp, rec in recs.items():
        assert rec.command and rec.commit and rec.host and rec.benchmark and rec.title and rec.headline, exp
        assert rec.host_kind == host_kind(rec.host), exp
        for name in rec.files:
            assert (records.RESULTS / exp / name).is_file(), (exp, name)
        for bench, name in JSON_OF.items():
            if name in rec.files:  # the figures the docs quote are the JSON's, recomputed
                data = json.loads((records.RESULTS / exp / name).read_text())
                assert rec.headline == records.HEADLINES[bench](data), exp
        if not any(f.endswith(".json") for f in rec.files):
            assert "transcribed" in rec.note.lower(), f"{exp}: no JSON, so its note must say where its figures come from"


def test_the_generated_tables_are_the_records_of_today():
    """`python -m benchmarks.records index` changes nothing: every table, index, card and the
    demo's packaged expectations say what the records say."""
    stale = [str(p.relative_to(ROOT)) for p, text in records.render().items() if not p.is_file() or p.read_text() != text]
    assert not stale, f"run `python -m benchmarks.records index`: {stale}"


def expect_rows() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = text.split(records.BEGIN.format("expect"), 1)[1].split(records.END.format("expect"), 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
    return rows[2:]  # below the header and its rule


def test_every_readme_figure_is_in_the_record_it_links():
    rows = expect_rows()
    assert 1 <= len(rows) <= 5  # the demo's two, the two learning rows, TRL side by side (issue 98)
    recs = records.load_all()
    cells = 0
    for row in rows:
        for cell in row[1:]:
            if not cell:
                continue
            parts = re.findall(r"(.*?)\(\[record\]\(docs/results/([^/)]+)/\)\)", cell)
            assert parts and cell.endswith("/))"), cell  # every figure is followed by its record's link
            for figure, exp in parts:  # each figure in the record whose link follows it
                quoted = records.numbers(figure)
                assert quoted, cell
                held = set(records.numbers(" ".join(recs[exp].headline.values())))
                assert set(quoted) <= held, (figure, exp, sorted(held))
            cells += 1
    assert cells >= 4


def test_the_readmes_learning_rows_are_the_pre_registered_runs_against_both_baselines():
    """Issue 85: what RL adds is shown from the pre-registered runs on knowledge bases no choice saw,
    against rejection sampling and continued SFT, median and range across cells where there are
    several; KB 101 is named as the KB the settings were chosen on, and the README does not claim
    that GRPO beats SFT."""
    text = (ROOT / "README.md").read_text()
    prereg = (ROOT / "docs" / "preregistration" / "rl_beyond_imitation.md").read_text()
    rows = [r for r in expect_rows() if "rl_vs_sft" in " ".join(r)]
    assert len(rows) == 2
    for row in rows:
        for exp in re.findall(r"\(docs/results/([^/)]+)/\)", row[1]):
            assert f"(../results/{exp}/)" in prereg  # a run of the pre-registration's table
        assert "GRPO − RFT (best checkpoints)" in row[1] and "GRPO − SFT more (best checkpoints)" in row[1]
    for row, kind in zip(rows, ("lookalike", "standard")):
        assert "median" in row[1] and "range" in row[1] and "over 3 cells" in row[1] and kind in row[0]
    assert "KB 101, where the settings were chosen" in text
    assert "does not show that GRPO beats SFT" in text


FIGURE = re.compile(r"(?<![\w.\-])[+\u2212]\d+(?:\.\d+)?|(?<=\s)-\d+(?:\.\d+)?\b"
                    r"|\d+(?:\.\d+)?\s?%(?!\s+interval)|\d(?:\.\d+)?×")
"""A quoted result: a signed difference, a percentage (not an interval's level) or a ratio."""


def prose(text: str) -> str:
    """The text a reader reads as claims: without code, generated tables and link targets."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!-- records:begin (\w+) -->.*?<!-- records:end \1 -->", "", text, flags=re.S)
    text = re.sub(r"^ {4}.*$", "", text, flags=re.M)  # indented code
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


@pytest.mark.parametrize("doc", DOCS)
def test_documents_quote_results_only_through_generated_tables(doc):
    found = FIGURE.findall(prose((ROOT / doc).read_text()))
    assert not found, f"{doc} quotes {found} outside a generated table: keep a record and generate the table"


def test_the_tables_are_at_most_what_the_docs_may_hold():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    for doc in ("docs/real_data.md", "docs/gpu.md"):
        text = (ROOT / doc).read_text()
        assert len(text.splitlines()) < 300, doc
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{doc} holds a dated run narrative"


def test_a_benchmark_keeps_its_record_and_the_index_reads_it(tmp_path, monkeypatch):
    """The one call every benchmark makes: the record (command, commit, hardware line, settings,
    the headline computed from the result) beside the full JSON and the PNG; then `keep` copies
    it into a results tree whose index and card name it."""
    src = records.RESULTS / "rl_vs_sft_kb101_gpu_h200"
    result = json.loads((src / "rl_vs_sft.json").read_text())
    args = argparse.Namespace(kb_seed=101, minutes=1.0, record_dir=str(tmp_path / "run"))
    monkeypatch.setattr("sys.argv", ["benchmarks/rl_vs_sft.py", "--kb-seed", "101", "--minutes", "1"])
    path = records.keep(args, "rl_vs_sft", result, files=[src / "rl_vs_sft.png"], title="GRPO against SFT on a GPU")
    rec = read_record(path)
    assert rec.command == "python benchmarks/rl_vs_sft.py --kb-seed 101 --minutes 1"
    assert rec.host == result["host"] and rec.host_kind == "GPU (NVIDIA H200 x1)"
    assert rec.settings == {"kb_seed": 101, "minutes": 1.0} and rec.benchmark == "benchmarks/rl_vs_sft.py"
    assert rec.headline == records.rl_vs_sft_headline(result)
    assert rec.commit != "" and rec.date
    assert rec.files == ["rl_vs_sft.json", "rl_vs_sft.png"]
    assert json.loads((tmp_path / "run" / "rl_vs_sft.json").read_text()) == result
    assert (tmp_path / "run" / "rl_vs_sft.png").read_bytes() == (src / "rl_vs_sft.png").read_bytes()

    kept = records.keep_dir(tmp_path / "run", "gpu_rvs", results=tmp_path / "results")
    loaded = records.load_all(tmp_path / "results")
    assert list(loaded) == ["gpu_rvs"] and kept == tmp_path / "results" / "gpu_rvs"
    index = records.index_markdown(loaded)
    assert "[gpu_rvs](gpu_rvs/)" in index and "−0.5 [−4.0, +3.0] (1 seed)" in index
    assert "![rl_vs_sft.png](rl_vs_sft.png)" in records.card(loaded["gpu_rvs"])


def test_a_record_in_the_wrong_directory_is_refused(tmp_path):
    d = tmp_path / "results" / "one"
    d.mkdir(parents=True)
    rec = json.loads((records.RESULTS / "make_test_2core_avx2" / "record.json").read_text())
    (d / "record.json").write_text(json.dumps({**rec, "experiment": "another"}))
    with pytest.raises(ValueError, match="is not its directory's name"):
        records.load_all(tmp_path / "results")


def test_numbers_reads_signs_and_true_minus():
    assert records.numbers("−5.0 [−10.2, +0.2] (1 seed), 1,589 steps") == [-5.0, -10.2, 0.2, 1, 1589]


def test_the_figure_check_sees_results_and_not_settings():
    """The check above can fail: it finds each kind of quoted result, and leaves settings alone."""
    found = FIGURE.findall(prose("GRPO gained +4.0 and lost −5.0 (was -2.5); 12% of samples; 0.93× plain. "
                                 "`+9.0` in code, [a record](docs/run+1.0/)."))
    assert found == ["+4.0", "−5.0", "-2.5", "12%", "0.93×"]
    assert not FIGURE.findall(prose("a paired 95% interval, lr 7e-6, a 2-core CPU, KB 101, 8 prompts × 4 samples"))


def test_an_index_line_shows_every_control_its_first_figure_is_compared_with():
    """The index's main figure is the first headline figure; where it is "A − B (how)", A's
    comparisons with the other arms measured the same way follow it, so that a line never shows
    GRPO against one control alone; other figures stay in the record."""
    from dataclasses import replace

    rec = read_record(records.RESULTS / "rl_vs_sft_lookalike_kb201_nbf16" / "record.json")
    line = records.main_figure(rec)
    assert line.startswith("GRPO − SFT more (best checkpoints): ") and "; GRPO − RFT (best checkpoints): " in line
    assert "RFT − SFT more" not in line and "last checkpoints" not in line
    h = {"GRPO − SFT more (best checkpoints)": "+1.0", "SFT all − SFT more (best checkpoints)": "+2.0",
         "GRPO − RFT (same minutes)": "+3.0", "GRPO − RFT (best checkpoints)": "−4.0", "agent EM": "5.0"}
    assert records.main_figure(replace(rec, headline=h)) == \
        "GRPO − SFT more (best checkpoints): +1.0; GRPO − RFT (best checkpoints): −4.0"
    assert records.main_figure(replace(rec, headline={"agent EM": "5.0", "GRPO − RFT (x)": "1"})) == "agent EM: 5.0"
    assert records.main_figure(replace(rec, headline={})) == "(figures in the JSON)"


# ----------------------------------------------------------------------------- records from elsewhere (issue 100)
HOST = "cpu=x86_64 cores=2 gpu=none native_bf16=yes"


def a_run(tmp_path: Path, files: dict[str, str] | None = None, **fields) -> Path:
    """A run's record directory as a benchmark leaves it: record.json and the files it names."""
    from agent_rl.demo.records import write_record

    run = tmp_path / "run"
    run.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {"r.json": "{}"}).items():
        (run / name).write_text(text)
    write_record(run, experiment="run", title="t", benchmark="benchmarks/x.py", headline={"a": "1"},
                 settings=fields.pop("settings", {}), files=[run / n for n in (files or {"r.json": ""})],
                 command=fields.pop("command", "python benchmarks/x.py"), host=HOST, commit="abc1234")
    return run


def rename_files(run: Path, names: list[str]) -> None:
    data = json.loads((run / "record.json").read_text())
    (run / "record.json").write_text(json.dumps({**data, "files": names}))


@pytest.mark.parametrize("experiment", ["../escaped", "/tmp/escaped_abs", "a/b", "..", "", ".hidden"])
def test_keep_refuses_an_experiment_name_that_leaves_docs_results(tmp_path, experiment):
    """Issue 100 case 13: `keep`'s experiment is one directory under docs/results, named in the error."""
    run, results = a_run(tmp_path), tmp_path / "results"
    with pytest.raises(ValueError, match=re.escape(repr(experiment))):
        records.keep_dir(run, experiment, results=results)
    assert not results.exists() and not (tmp_path / "escaped").exists()
    assert records.main(["keep", str(run), experiment]) == 2  # the CLI says why, no traceback


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/hostname", "sub/r.json"])
def test_keep_refuses_a_record_whose_files_leave_its_directory(tmp_path, name):
    (tmp_path / "outside.txt").write_text("not the run's")
    run, results = a_run(tmp_path), tmp_path / "results"
    rename_files(run, ["r.json", name])
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        records.keep_dir(run, "ok", results=results)
    assert not (results / "ok").exists()  # nothing copied before the check
    with pytest.raises(ValueError, match=re.escape(repr(name))):  # a record already under docs/results
        records.load_all(Path(shutil.copytree(run, tmp_path / "res2" / "run")).parent)


def test_keep_copies_no_symbolic_link_from_the_run_or_into_the_results(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    run, results = a_run(tmp_path, {"r.json": "{}", "p.png": "png"}), tmp_path / "results"
    (run / "p.png").unlink()
    (run / "p.png").symlink_to(secret)  # a link in the run: would copy what it points to
    with pytest.raises(ValueError, match="p.png is a symbolic link"):
        records.keep_dir(run, "ok", results=results)
    assert not (results / "ok").exists()

    run = a_run(tmp_path / "b")
    (results / "elsewhere").mkdir(parents=True)
    (results / "linked").symlink_to(results / "elsewhere")  # a link in the results: would write through it
    with pytest.raises(ValueError, match="linked is a symbolic link"):
        records.keep_dir(run, "linked", results=results)
    (results / "ok").mkdir()
    (results / "ok" / "r.json").symlink_to(secret)
    with pytest.raises(ValueError, match="r.json is a symbolic link"):
        records.keep_dir(run, "ok", results=results)
    assert secret.read_text() == "private" and not list((results / "elsewhere").iterdir())
    assert records.keep_dir(run, "fine", results=results) == results / "fine"  # a plain one is kept


# ----------------------------------------------------------------------------- text in tables (issue 100)
HOSTILE = "GRPO | RFT\n<!-- records:end records -->\n| x | y |"


def hostile_record(title: str = HOSTILE, label: str = "a | b\n<!-- records:begin records -->"):
    from dataclasses import replace

    rec = read_record(records.RESULTS / "make_test_2core_avx2" / "record.json")
    return replace(rec, experiment="bad", title=title, headline={label: "1 | 2\n3", **rec.headline})


def unescaped_cells(row: str) -> list[str]:
    return re.split(r"(?<!\\)\|", row.strip().strip("|"))


def test_a_title_or_label_cannot_break_a_table_or_its_block():
    """Issue 100 case 14: `|`, a newline or an index marker in a record's title or headline stays
    inside its cell; the block `index` fills is the same after a second run (it grew by the old
    table's rest at every run), and once the title is mended `index --check` finds it current."""
    rec = hostile_record()
    table = records.records_table({"bad": rec}, lambda r: True, "results/")
    rows = table.splitlines()
    assert len(rows) == 3 and len(unescaped_cells(rows[2])) == 4
    assert "records:end" in rows[2] and "<!--" not in table  # kept, as text: &lt;!--
    index = records.index_markdown({"bad": rec})
    assert "<!--" not in index and len(unescaped_cells(index.splitlines()[-1])) == 5
    card = records.card(rec).splitlines()
    assert card[2] == "GRPO \\| RFT &lt;!-- records:end records --> \\| x \\| y \\|"
    assert "| a \\| b &lt;!-- records:begin records --> | 1 \\| 2 3 |" in card

    doc = f"head\n{records.BEGIN.format('records')}\nold\n{records.END.format('records')}\ntail\n"
    once = records.fill(doc, "records", table, "doc")
    assert records.fill(once, "records", table, "doc") == once
    mended = records.records_table({"bad": hostile_record("GRPO against RFT")}, lambda r: True, "results/")
    assert records.fill(once, "records", mended, "doc") == records.fill(doc, "records", mended, "doc")


def test_fill_refuses_a_block_with_a_second_marker():
    """A marker written into a block by hand (or by the old index) is named, not filled around."""
    begin, end = records.BEGIN.format("records"), records.END.format("records")
    for doc in (f"{begin}\n{end}\n{end}\n", f"{begin}\n{begin}\n{end}\n", f"{end}\n{begin}\n"):
        with pytest.raises(ValueError, match="not one block"):
            records.fill(doc, "records", "t", "docs/x.md")


# ----------------------------------------------------------------------------- secrets (issue 100)
KEY = "s3cr3t-key-9f2"


def test_a_benchmarks_record_holds_no_secret(tmp_path, monkeypatch):
    """Issue 100 case 15: a key given as an override reaches neither record.json (its command
    and settings) nor the full JSON: the config loader's `redacted` replaces it."""
    monkeypatch.delenv("RETRIEVER_API_KEY", raising=False)
    monkeypatch.setattr("sys.argv", ["benchmarks/learning.py", "--minutes", "1", f"retriever.api_key={KEY}",
                                     "trainer.total_epochs=1"])
    args = argparse.Namespace(minutes=1.0, overrides=[f"retriever.api_key={KEY}", "trainer.total_epochs=1"],
                              record_dir=str(tmp_path / "run"))
    path = records.keep(args, "learning", {"overrides": args.overrides, "em": 0.5})
    assert KEY not in path.read_text() and KEY not in (tmp_path / "run" / "learning.json").read_text()
    rec = read_record(path)
    assert rec.command == "python benchmarks/learning.py --minutes 1 retriever.api_key=<redacted> trainer.total_epochs=1"
    assert rec.settings["overrides"] == ["retriever.api_key=<redacted>", "trainer.total_epochs=1"]
    assert json.loads((tmp_path / "run" / "learning.json").read_text())["em"] == 0.5


def test_a_record_from_elsewhere_is_kept_without_its_secrets(tmp_path, monkeypatch):
    """A record written before (or elsewhere) with a key in its command, a config section in its
    settings, or the key the environment holds: `keep` redacts each before docs/results."""
    monkeypatch.setenv("RETRIEVER_API_KEY", "env-key-77")
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.json").write_text(json.dumps({
        "experiment": "run", "title": "t", "benchmark": "b", "commit": "abc", "host": HOST,
        "host_kind": "native bf16", "headline": {"a": "1"}, "files": [], "date": "2025-01-01",
        "command": f"RETRIEVER_API_KEY=other-key python b.py +retriever.api_key={KEY}",
        "settings": {"config": {"retriever": {"api_key": "cfg-key-5"}}, "note": "used env-key-77"}}))
    kept = (records.keep_dir(run, "kept", results=tmp_path / "results") / "record.json").read_text()
    for secret in (KEY, "other-key", "cfg-key-5", "env-key-77"):
        assert secret not in kept
    data = json.loads(kept)
    assert data["command"] == "RETRIEVER_API_KEY=<redacted> python b.py +retriever.api_key=<redacted>"
    assert data["settings"] == {"config": {"retriever": {"api_key": "<redacted>"}}, "note": "used <redacted>"}
    assert data["headline"] == {"a": "1"} and data["experiment"] == "kept"


# ----------------------------------------------------------------------------- what the docs select (issue 101)
def results_tree(tmp_path: Path) -> Path:
    """A checkout's documents and records under tmp_path, for `render` to read and fill."""
    shutil.copytree(records.RESULTS, tmp_path / "docs" / "results")
    for doc in DOCS:
        shutil.copy2(ROOT / doc, tmp_path / doc)
    return tmp_path


def test_the_data_file_drives_the_readme_table_and_the_demo_sentences(tmp_path):
    """Issue 101 item 3: docs/results/expect.yaml, not code, chooses the what-to-expect rows and
    the report's sentences. A row added there appears in README.md's table (its figure the
    record's headline, 120 / 27 steps, with its link; the columns it leaves out empty), and a
    sentence changed there is the one the demo's report says."""
    import yaml

    from agent_rl.demo.report import expectations

    root = results_tree(tmp_path)
    path = root / "docs" / "results" / records.SELECTION
    data = yaml.safe_load(path.read_text())
    cell = {"record": "rl_vs_sft_kb101_gpu_h200", "figure": "steps: SFT more / GRPO"}
    data["expect"].append({"label": "a row from the data file", "cells": {"GPU": cell}})
    data["demo_report"]["closing"] = "A closing sentence from the data file."
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    out = records.render(root)
    new_rows, old_rows = (text.split(records.BEGIN.format("expect"))[1].split(records.END.format("expect"))[0]
                          for text in (out[root / "README.md"], (ROOT / "README.md").read_text()))
    assert new_rows == old_rows + \
        "| a row from the data file |  |  | 120 / 27 ([record](docs/results/rl_vs_sft_kb101_gpu_h200/)) |\n"
    packaged = json.loads(out[root / "agent_rl" / "demo" / "expectations.json"])
    said = expectations({"native_bf16": True, "gpu": None}, packaged)
    assert said.endswith("\n\nA closing sentence from the data file.\n") and "one run of a few GRPO steps" not in said


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["demo_report"].update(unseen="{label} {figur}"), r"demo_report\.unseen: uses \['figur'\]"),
    (lambda d: d["demo_report"].pop("closing"), "needs exactly the cases"),
    (lambda d: d["expect"][0]["cells"].update(TPU={"record": "x", "figure": "y"}), r"expect\[0\]: column 'TPU'"),
    (lambda d: d["expect"][0]["cells"]["GPU"].update(figures=["a"]), r"expect\[0\]\.GPU: name one headline label"),
    (lambda d: d["demo_quotes"][0].update(where="kb102"), r"demo_quotes\[0\]"),
    (lambda d: d["suite"][1].pop("where"), r"suite\[1\]: an entry is \{record, where\}"),
])
def test_a_mistake_in_the_data_file_is_named(tmp_path, edit, match):
    """A placeholder its case does not fill, a missing case, an unknown column, a cell with both
    `figure` and `figures`, an unknown case: refused by `index`, naming the entry, not found by
    a newcomer's demo as a KeyError."""
    import yaml

    data = yaml.safe_load((records.RESULTS / records.SELECTION).read_text())
    edit(data)
    path = tmp_path / records.SELECTION
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    with pytest.raises(ValueError, match=match):
        records.load_selection(path)


def test_a_figure_the_records_do_not_hold_is_named():
    selection = records.load_selection(records.RESULTS / records.SELECTION)
    selection["expect"][0]["cells"]["GPU"]["figure"] = "no such label"
    with pytest.raises(ValueError, match=r"expect\[0\]\.GPU: record 'gpu_loop_h200_run11' has no headline figure"):
        records.expect_table(records.load_all(), selection)


def test_the_vs_trl_headline_by_hand():
    """vs_trl's record: ours ÷ TRL for each table figure it has, the steps or a side's error,
    the three agent EMs (one not measured) and the paired differences that exist."""
    d = {"diff": 0.035, "ci_low": -0.02, "ci_high": 0.09, "n": 200}
    result = {"sides": {"ours": {"steps": 4}, "trl": {"steps": 1}},
              "ratios": {"steps_per_hour": 3.84, "step_s": 0.26, "tokens_per_s": None, "peak_rss_gib": 0.5},
              "eval": {"n": 200, "em": {"start": {"em": 0.36}, "ours": {"em": 0.395}}, "ours_minus_start": d}}
    assert records.vs_trl_headline(result) == {
        "ours ÷ TRL, GRPO steps per hour": "3.84x", "ours ÷ TRL, seconds per step": "0.26x",
        "ours ÷ TRL, peak memory": "0.50x", "GRPO steps: ours / TRL": "4 / 1",
        "agent EM on 200 questions: start / ours / TRL": "36.0 / 39.5 / not measured",
        "ours − start, agent EM": "+3.5 [\u22122.0, +9.0]"}
    failed = {"sides": {"ours": {"steps": 3}, "trl": {"error": "boom"}}, "ratios": {}, "eval": None}
    assert records.vs_trl_headline(failed) == {"GRPO steps: ours / TRL": "3 / error"}
    probed = {**failed, "strategy": {"better_share": {"start": 17 / 139, "ours": 0.2, "trl": None}},
              "trl_vllm_probe": {"outcome": "failed: boom", "log": "x"}}
    assert records.vs_trl_headline(probed) == {
        "GRPO steps: ours / TRL": "3 / error", "better-strategy share of searches: start / ours / TRL":
        "12.2% / 20.0% / n/a", "TRL with vLLM colocate on this host": "failed: boom"}
