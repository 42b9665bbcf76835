"""The benchmarks refuse bad input before they start, in one line naming the option or path."""
from __future__ import annotations

import pytest

from asrdist.cli import main


@pytest.mark.parametrize("args, message", [
    (["data", "--data", "{tmp}/nowhere"], "--data {tmp}/nowhere: no such directory"),
    (["data", "--data", "{tmp}/file.txt"], "--data {tmp}/file.txt: not a directory"),
    (["scaling", "--learners", "1", "--strategies", ""], "bench scaling: --strategies '' names no strategy"),
    (["faults", "--only", ","], "bench faults --only ',' names no case"),
    (["compare", "{tmp}/file.txt"], "{tmp}/file.txt: not a run directory"),
])
def test_bad_bench_input_is_one_line(args, message, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("not a run\n")
    out = tmp_path / "out.json"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    json_args = [] if args[0] == "compare" else ["--json", str(out)]
    assert main(["bench", args[0], *json_args, *args[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("asrdist: error: " + message.replace("{tmp}", str(tmp_path))) and err.count("\n") == 1, err
    assert not out.exists()


def test_bench_data_needs_utterances_for_one_chunk_batch(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "data", "--json", "x.json", "--utterances", "3"])
    assert exit.value.code == 2 and "--utterances: expected an integer >= 16" in capsys.readouterr().err
