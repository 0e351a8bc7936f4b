"""`make demo`: the whole pipeline on the embedded default, apart from the library.

- `cli`: the commands' parsers (`python -m agent_rl.demo`, `python -m agent_rl.demo calibrate`);
- `pipeline`: the stages in order, each the command a user would type, then the report;
- `stages`: those commands, how one runs as its own process, and the workdir's files
  (benchmarks/rl_vs_sft builds the same stages from them);
- `budget`: the stages sized to the host's calibrated speed and the minutes left
  (configs/demo.yaml holds the work per unit);
- `calibrate`: that speed;
- `report`: the report;
- `records`: a run's record (`record.json`: command, commit, hardware line, settings, headline
  figures), which the report and every benchmark write (docs/results/README.md).
"""
