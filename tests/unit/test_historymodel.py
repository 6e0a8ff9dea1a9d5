"""The drift alarms (validate.historymodel): a figure against the median of its last runs on the partition, the
facts that changed since the last good run named beside it, the recipe's threshold turning it into a failure."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.validate import historymodel
from envbuilder.validate.report import Report, Row


def _run(
    busbw: float,
    *,
    partition: str = "gpu-a100",
    driver: str = "550.54",
    modules: Optional[dict[str, str]] = None,
    import_s: float = 2.0,
    status: str = "pass",
) -> dict[str, Any]:
    return {
        "version": 1,
        "env": "e",
        "partition": partition,
        "nodes": ["n1", "n2"],
        "facts": {
            "driver": driver,
            "cuda": "12.4",
            "torch": "2.5.1",
            "glibc": "2.35",
            "modules": modules or {},
        },
        "checks": [
            {
                "name": "import",
                "status": "pass",
                "figures": {"import_s": import_s},
                "units": {"import_s": "s"},
            },
            {"name": "nccl", "status": status, "figures": {"busbw": busbw}, "units": {"busbw": "GB/s"}},
        ],
    }


def test_a_drop_names_the_facts_that_changed_since_the_last_good_run():
    past = [_run(v, modules={"nccl": "2.18"}) for v in (330, 325, 335, 329, 331)]
    now = _run(211, driver="570.86", modules={"nccl": "2.18", "cuda": "12.8"})
    (alarm,) = historymodel.compare(now, past)
    assert alarm.figure == "nccl.busbw" and alarm.median == 330 and alarm.runs == 5
    assert alarm.changes == ("driver 550.54 -> 570.86", "module cuda/12.8 appeared")
    assert alarm.text == (
        "nccl bus bandwidth 211 GB/s, 36% below its median of 330 GB/s over the last 5 runs on gpu-a100 "
        "since driver 550.54 -> 570.86 and module cuda/12.8 appeared"
    )
    assert not alarm.fails  # no threshold: reported only
    assert alarm.to_json()["worse"] == round((330 - 211) / 330, 4)


def test_the_window_is_the_partition_s_last_ten_passing_runs():
    # Eleven old fast runs drop out of the window; the other partition's slow runs and a failed run never count.
    past = [_run(500) for _ in range(11)] + [_run(300) for _ in range(10)]
    past += [_run(50, partition="debug") for _ in range(5)] + [_run(10, status="fail")]
    assert historymodel.compare(_run(290), past) == []
    (alarm,) = historymodel.compare(_run(200), past)
    assert alarm.median == 300 and alarm.runs == 10


def test_too_little_history_raises_nothing():
    assert historymodel.compare(_run(1), [_run(300), _run(300)]) == []


def test_a_time_drifts_upwards():
    past = [_run(300, import_s=2.0) for _ in range(4)]
    (alarm,) = historymodel.compare(_run(300, import_s=5.0, modules={"drifty": "2.0"}), past)
    assert alarm.figure == "import.import_s" and alarm.worse == 1.5
    assert "150% above its median of 2 s" in alarm.text
    assert alarm.changes == ("module drifty/2.0 appeared",)
    # A faster import is no alarm.
    assert historymodel.compare(_run(300, import_s=0.5), past) == []


def test_the_threshold_fails_a_drift_as_large():
    past = [_run(300) for _ in range(5)]
    (alarm,) = historymodel.compare(_run(200), past, threshold=0.3)
    assert alarm.fails
    (alarm,) = historymodel.compare(_run(200), past, threshold=0.5)
    assert not alarm.fails
    # A threshold below the default alarm level reports (and fails) smaller drops too.
    (alarm,) = historymodel.compare(_run(270), past, threshold=0.05)
    assert alarm.fails


def test_a_module_version_change_and_a_gone_module_are_named():
    before = _run(1, modules={"drifty": "1.0", "old": "3"})
    after = _run(1, modules={"drifty": "2.0"})
    assert historymodel.changes(before, after) == ["module drifty 1.0 -> 2.0", "module old/3 is gone"]


def test_the_record_of_a_report_holds_the_agreed_fields():
    row = Row(
        "nccl",
        "pass",
        (0, 1),
        {"busbw": {"value": 12.5, "unit": "GB/s"}},
        per_rank={
            0: {
                "seconds": 1.0,
                "sweep": [{"bytes": 1024, "busbw": 0.5, "us": 40.0}, {"bytes": 4096, "busbw": 1.5}],
            },
            1: {"seconds": 1.5, "figures": {"busbw": {"value": 12.0, "unit": "GB/s"}}},
        },
    )
    imp = Row("import", "pass", (0,), per_rank={0: {"seconds": 0.5, "torch": "2.13.0", "cuda": None}})
    result = Report(
        env="e",
        launcher="torchrun",
        device="cpu",
        world=2,
        nodes=1,
        command=(),
        rows=(imp, row),
        seconds=3.0,
        exit_code=0,
        where="here",
        started="",
        hosts={0: "n1", 1: "n1"},
        modules=("drifty/1.0", "plain"),
        node={"glibc": "2.39"},  # where rank 0 ran (a job's node), which wins over this host's
    )
    host = HostFacts(driver_version="550.54", glibc="2.36", gpus=(Gpu(name="A100"),))
    facts = historymodel.facts_of(host, result)
    assert facts == {
        "driver": "550.54",
        "cuda": "",
        "torch": "2.13.0",
        "glibc": "2.39",
        "modules": {"drifty": "1.0", "plain": ""},
        "gpus": ["A100"],
    }
    rec = historymodel.record_of(result, recipe="r", recipe_version="1.0", facts=facts, at="T")
    assert rec["nodes"] == ["n1"] and rec["ranks"] == 2 and rec["partition"] == "" and rec["status"] == "pass"
    assert rec["checks"][1] == {
        "name": "nccl",
        "status": "pass",
        "seconds": 1.5,
        "figures": {"busbw": 12.5},
        "units": {"busbw": "GB/s"},
        # What the report plots: each rank's time and figures, rank 0's bandwidth by message size.
        "per_rank": {"0": {"seconds": 1.0}, "1": {"busbw": 12.0, "seconds": 1.5}},
        "sweep": [{"bytes": 1024, "busbw": 0.5}, {"bytes": 4096, "busbw": 1.5}],
    }


@pytest.mark.parametrize(
    "values", [[3.0], [1.0, 2.0], [5.0, 1.0, 3.0], [4.0, 1.0, 3.0, 2.0], [2.5, 2.5, 0.1, 9.0, 7.0]]
)
def test_the_median_is_the_statistics_modules(values):
    import statistics

    assert historymodel._median(values) == statistics.median(values)
