"""The run's metrics log: whole lines only, and a damaged line never stops a resume."""

import json

from tformer.train.metrics import MetricsLog


def test_records_skip_a_torn_last_line_and_lines_a_hand_edit_broke(tmp_path):
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.write({"step": step, "train_loss": 1.0 / step})
    with log.jsonl.open("a") as f:
        f.write('{"step": 4, "train_lo')  # killed inside the write
    text = log.jsonl.read_text().replace('{"step": 2,', '{"step": "two",', 1)
    log.jsonl.write_text(text.replace('"train_loss": 1.0}', '"train_loss": 1.0', 1))  # step 1 no longer parses
    assert [r["step"] for r in log.records()] == [3]
    log.truncate_after(3)  # what a resume from step 3 does: the log is whole again
    assert [json.loads(line)["step"] for line in log.jsonl.read_text().splitlines()] == [3]


def test_csv_has_one_header_and_one_row_per_record(tmp_path):
    log = MetricsLog(tmp_path)
    log.write({"step": 1, "train_loss": 2.5, "lr": 0.1})
    log.write({"step": 2, "train_loss": 2.0, "lr": 0.1, "not_a_column": 7})
    lines = log.csv.read_text().splitlines()
    assert lines[0].startswith("step,train_loss,") and len(lines) == 3
    assert lines[2].split(",")[:2] == ["2", "2.0"]
