"""How the train server's CLI and pages show values (trainforge/_internal/display.py, and the one number
formatter, trainforge/_internal/amounts.py): one rule each,
and what those rules give for the cases a user met (issue 25: memory as ``0/2.3129e+10``, Tune trial
names cut to one prefix, ``epoch`` before ``val_accuracy``)."""

from __future__ import annotations

import pytest

from trainforge._internal.amounts import fmt_bytes, fmt_resources
from trainforge._internal.display import column_width, cut_middle, metric_rank, ordered_metrics
from trainforge._internal.key_values import parse_resources

# The values the browser test also gives static/units.js: both must print the same text.
BYTES_CASES = {
    0: "0 B", 100: "100 B", 1023: "1023 B", 1023.6: "1.0 KiB", 1024: "1.0 KiB", 1280: "1.3 KiB",
    10_300: "10.1 KiB", 1_048_575: "1.0 MiB", 2.3129e10: "21.5 GiB", 5e15: "4.4 PiB", 2**60: "1024.0 PiB",
}  # fmt: skip


@pytest.mark.parametrize(("n", "text"), BYTES_CASES.items())
def test_bytes_in_binary_units_with_one_decimal(n, text):
    assert fmt_bytes(n) == text


def test_a_shown_memory_amount_reads_back_as_what_it_says():
    # What the CLI and the pages show can be passed back to --capacity.
    shown = fmt_bytes(2.3129e10)
    assert abs(parse_resources(f"memory={shown.replace(' ', '')}")["memory"] - 2.3129e10) < 0.05 * 2**30


def test_resources_by_kind():
    assert fmt_resources({"memory": 2.3129e10, "CPU": 2.0, "GPU": 0.5}) == "2 CPU, 0.5 GPU, 21.5 GiB memory"
    assert fmt_resources({}, "-") == "-" and fmt_resources(None) == ""


def test_names_fit_whole_or_lose_their_middle():
    trials = [f"asha-demo/objective_ab01_{i:05d}" for i in range(3)]
    width = column_width(trials, "NAME", 48)
    assert width == len(trials[0]) and [cut_middle(t, width) for t in trials] == trials  # whole: distinct
    long = "asha-demo/objective_ab01_00042_lr=0.0012345_momentum=0.9_seed=7"
    cut = cut_middle(long, 30)
    assert len(cut) == 30 and "..." in cut
    assert cut.startswith(long[:14]) and cut.endswith(long[-13:])  # both ends kept: what tells trials apart
    assert column_width([long], "NAME", 48) == 48


def test_validation_metrics_first_bookkeeping_last():
    model = {"epoch": 3, "batch_count": 40, "num_samples": 640, "train_loss": 0.31, "last_train_loss": 0.2,
             "val_accuracy": 0.97, "val_loss": 0.12, "time_total_s": 12.0, "accuracy_test": 0.95}  # fmt: skip
    assert [k for k, _ in ordered_metrics(model)] == [
        "val_accuracy", "val_loss", "accuracy_test", "train_loss", "last_train_loss", "epoch", "batch_count",
        "num_samples", "time_total_s",
    ]  # fmt: skip
    assert metric_rank("step") == metric_rank("training_iteration") == 3
    assert metric_rank("loss") == 1


def test_a_table_is_sized_to_its_content_and_cut_where_it_tells_least():
    from trainforge._internal.display import table

    header = ["ID", "NAME", "TRIALS", "STATES"]
    rows = [["1", "asha-demo_objective_2026-11-29_01-02-03", "45", "5 TERMINATED (3 pruned)"], ["12", "b", "3", "-"]]
    whole = table(header, rows, right=(0, 2), cut=1).splitlines()
    assert whole == ["ID  NAME                                     TRIALS  STATES",
                     " 1  asha-demo_objective_2026-11-29_01-02-03      45  5 TERMINATED (3 pruned)",
                     "12  b                                             3  -"]  # fmt: skip
    assert table(header, rows, right=(0, 2), cut=1, width=200).splitlines() == whole  # room: nothing cut
    narrow = table(header, rows, right=(0, 2), cut=1, width=64).splitlines()
    assert max(map(len, narrow)) <= 64
    assert " asha-demo_ob...-29_01-02-03 " in narrow[1] and narrow[1].endswith("5 TERMINATED (3 pruned)"), narrow
    tiny = table(header, rows, right=(0, 2), cut=1, width=40).splitlines()  # the name keeps its least, then the end goes
    assert max(map(len, tiny)) <= 40 and "asha-de...-02-03" in tiny[1] and tiny[1].endswith("..."), tiny
