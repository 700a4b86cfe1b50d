"""Config validation and the local worker environment (pure, no processes)."""

from __future__ import annotations

import math

import pytest

from trainforge import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainforge._internal.devices import assign_gpus
from trainforge._internal.worker_group.env import local_worker_specs

# -- ScalingConfig ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "exc", "allowed"),
    [
        (0, ValueError, ">= 1"),
        (-1, ValueError, ">= 1"),
        (1.5, TypeError, "must be an int"),
        (True, TypeError, "must be an int"),
        ("2", TypeError, "must be an int"),
    ],
)
def test_scaling_num_workers_invalid(value, exc, allowed):
    with pytest.raises(exc) as info:
        ScalingConfig(num_workers=value)
    msg = str(info.value)
    assert "num_workers" in msg
    assert repr(value) in msg
    assert allowed in msg


@pytest.mark.parametrize("n", [1, 2, 64])
def test_scaling_num_workers_valid(n):
    assert ScalingConfig(num_workers=n).num_workers == n


def test_scaling_use_gpu_with_zero_gpu_resource_rejected():
    with pytest.raises(ValueError) as info:
        ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 0})
    msg = str(info.value)
    assert "resources_per_worker['GPU']" in msg
    assert "use_gpu=True" in msg


def test_scaling_use_gpu_must_be_bool():
    with pytest.raises(TypeError, match="use_gpu='yes'"):
        ScalingConfig(use_gpu="yes")


def test_scaling_placement_strategy_typo():
    with pytest.raises(ValueError) as info:
        ScalingConfig(placement_strategy="PAKC")
    msg = str(info.value)
    assert "placement_strategy" in msg and "'PAKC'" in msg
    for valid in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
        assert valid in msg


@pytest.mark.parametrize("strategy", ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"])
def test_scaling_placement_strategy_valid(strategy):
    assert ScalingConfig(placement_strategy=strategy).placement_strategy == strategy


@pytest.mark.parametrize(
    "resources", [{"CPU": -1}, {"GPU": -0.5}, {"CPU": math.nan}, {"CPU": "2"}, {"CPU": True}]
)
def test_scaling_bad_resource_amounts(resources):
    key = next(iter(resources))
    with pytest.raises(ValueError) as info:
        ScalingConfig(resources_per_worker=resources)
    msg = str(info.value)
    assert f"resources_per_worker[{key!r}]" in msg
    assert ">= 0" in msg


def test_scaling_resources_must_be_dict():
    with pytest.raises(TypeError, match="resources_per_worker"):
        ScalingConfig(resources_per_worker=[("CPU", 1)])


def test_scaling_resource_names_must_be_strings():
    with pytest.raises(ValueError, match="resource names must be strings"):
        ScalingConfig(resources_per_worker={1: 1})


def test_scaling_gpu_above_one_must_be_whole():
    with pytest.raises(ValueError, match=r"resources_per_worker\['GPU'\]=1.5"):
        ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 1.5})
    assert ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 2}).gpus_per_worker == 2.0


def test_scaling_infinite_gpu_is_a_value_error():
    with pytest.raises(ValueError, match="resources_per_worker"):
        ScalingConfig(use_gpu=True, resources_per_worker={"GPU": math.inf})


@pytest.mark.parametrize(
    ("kwargs", "gpus"),
    [
        ({}, 0.0),
        ({"use_gpu": True}, 1.0),
        ({"use_gpu": True, "resources_per_worker": {"GPU": 0.5}}, 0.5),
        ({"use_gpu": True, "resources_per_worker": {"CPU": 4}}, 1.0),
        ({"use_gpu": False, "resources_per_worker": {"CPU": 4}}, 0.0),
        ({"use_gpu": True, "resources_per_worker": {"GPU": 2}}, 2.0),
    ],
)
def test_gpus_per_worker(kwargs, gpus):
    assert ScalingConfig(num_workers=2, **kwargs).gpus_per_worker == gpus


def test_cpus_per_worker():
    assert ScalingConfig().cpus_per_worker == 1.0
    assert ScalingConfig(resources_per_worker={"CPU": 3}).cpus_per_worker == 3.0


# -- CheckpointConfig / FailureConfig / RunConfig -----------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, 1.0, True])
def test_checkpoint_num_to_keep_invalid(k):
    with pytest.raises(ValueError) as info:
        CheckpointConfig(num_to_keep=k)
    msg = str(info.value)
    assert "num_to_keep" in msg and repr(k) in msg and ">= 1" in msg


def test_checkpoint_score_order_invalid():
    with pytest.raises(ValueError) as info:
        CheckpointConfig(checkpoint_score_attribute="acc", checkpoint_score_order="best")
    msg = str(info.value)
    assert "checkpoint_score_order" in msg and "'best'" in msg and "'max'" in msg and "'min'" in msg


def test_checkpoint_score_attribute_must_be_str():
    with pytest.raises(ValueError, match="checkpoint_score_attribute"):
        CheckpointConfig(checkpoint_score_attribute=3)


def test_checkpoint_config_valid():
    cc = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    assert (cc.num_to_keep, cc.checkpoint_score_attribute, cc.checkpoint_score_order) == (2, "loss", "min")
    assert CheckpointConfig().num_to_keep is None


@pytest.mark.parametrize("m", [-2, 1.5, True, "1"])
def test_failure_config_invalid(m):
    with pytest.raises(ValueError) as info:
        FailureConfig(max_failures=m)
    msg = str(info.value)
    assert "max_failures" in msg and repr(m) in msg and "-1" in msg


@pytest.mark.parametrize("m", [-1, 0, 3])
def test_failure_config_valid(m):
    assert FailureConfig(m).max_failures == m


@pytest.mark.parametrize("name", ["a/b", "", ".", ".."])
def test_run_config_bad_name(name):
    with pytest.raises(ValueError) as info:
        RunConfig(name=name)
    msg = str(info.value)
    assert "RunConfig.name" in msg and repr(name) in msg and "'/'" in msg


@pytest.mark.parametrize("verbose", [3, -1])
def test_run_config_bad_verbose(verbose):
    with pytest.raises(ValueError) as info:
        RunConfig(verbose=verbose)
    msg = str(info.value)
    assert "verbose" in msg and repr(verbose) in msg and "0, 1 or 2" in msg


def test_run_config_defaults_and_coercion(tmp_path):
    rc = RunConfig(name="exp-1", storage_path=tmp_path, verbose=0)
    assert rc.storage_path == str(tmp_path)
    assert isinstance(rc.checkpoint_config, CheckpointConfig)
    assert isinstance(rc.failure_config, FailureConfig)
    assert rc.failure_config.max_failures == 0


def test_run_config_wrong_types():
    with pytest.raises(TypeError, match="checkpoint_config"):
        RunConfig(checkpoint_config={"num_to_keep": 1})
    with pytest.raises(TypeError, match="failure_config"):
        RunConfig(failure_config=2)
    with pytest.raises(TypeError, match="callbacks"):
        RunConfig(callbacks=object())
    with pytest.raises(ValueError, match="storage_path"):
        RunConfig(storage_path=123)


# -- worker environment -------------------------------------------------------------------------------


def test_assign_gpus_cpu_only():
    assert assign_gpus(3, 0, []) == [[], [], []]


def test_assign_gpus_one_each():
    assert assign_gpus(2, 1, ["0", "1", "2"]) == [["0"], ["1"]]


def test_assign_gpus_fraction_packs_two_per_gpu():
    assert assign_gpus(4, 0.5, ["0", "1"]) == [["0"], ["0"], ["1"], ["1"]]
    assert assign_gpus(3, 0.5, ["3", "5"]) == [["3"], ["3"], ["5"]]


def test_assign_gpus_several_per_worker():
    assert assign_gpus(2, 2, ["0", "1", "2", "3"]) == [["0", "1"], ["2", "3"]]


@pytest.mark.parametrize(
    ("n", "per", "available", "needed"),
    [(3, 1, ["0", "1"], 3), (5, 0.5, ["0", "1"], 3), (2, 2, ["0", "1", "2"], 4), (1, 1, [], 1)],
)
def test_assign_gpus_too_few(n, per, available, needed):
    with pytest.raises(ValueError) as info:
        assign_gpus(n, per, available)
    msg = str(info.value)
    assert f"{n} worker(s)" in msg
    assert f"({needed} GPU(s) in all)" in msg
    assert f"has {len(available)} visible GPU(s)" in msg


def test_local_worker_specs_cpu(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    scaling = ScalingConfig(num_workers=3, resources_per_worker={"CPU": 2})
    specs = local_worker_specs(scaling, attempt=1, n=3, gpu_groups=[[], [], []])
    assert [s.rank for s in specs] == [0, 1, 2]
    for rank, spec in enumerate(specs):
        assert (spec.local_rank, spec.world_size, spec.local_world_size, spec.node_rank) == (rank, 3, 3, 0)
        env = spec.env
        assert env["RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "3"
        assert env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert env["OMP_NUM_THREADS"] == "2"
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU share: it sees none, as a Ray actor would
        assert spec.gpu_ids == []


def test_local_worker_specs_keeps_user_omp_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    (spec,) = local_worker_specs(ScalingConfig(), 0, 1, [[]])
    assert "OMP_NUM_THREADS" not in spec.env  # inherited from the driver instead


def test_local_worker_specs_gpu():
    scaling = ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 0.5})
    groups = assign_gpus(2, scaling.gpus_per_worker, ["4", "6"])
    specs = local_worker_specs(scaling, 0, scaling.num_workers, groups)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["4", "4"]
    assert [s.gpu_ids for s in specs] == [["4"], ["4"]]
    scaling = ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 2})
    specs = local_worker_specs(scaling, 0, 2, assign_gpus(2, 2, ["0", "1", "2", "3"]))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0,1", "2,3"]


def test_node_layout_numbers_nodes_by_first_rank():
    from trainforge._internal.worker_group.env import node_layout

    assert node_layout(["b", "a", "b", "c", "a"]) == [(0, 0, 2), (1, 0, 2), (0, 1, 2), (2, 0, 1), (1, 1, 2)]
    assert node_layout(["x"] * 3) == [(0, 0, 3), (0, 1, 3), (0, 2, 3)]
