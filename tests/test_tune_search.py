"""trainforge.tune's search layer: domains, variant generation (Ray's order and counts), the default
searcher, the concurrency limiter and OptunaSearch (ask/tell, points, grid, state), as pure units and
property tests."""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from trainforge.tune import _sample as tune
from trainforge.tune._variants import (
    count_variants,
    flatten_config,
    generate_variants,
    grid_size,
    has_unresolved,
    merge_config,
    resolve_variant,
    unflatten_config,
    validate_param_space,
)
from trainforge.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher
from trainforge.tune.search._searcher import PRUNED_RESULT_KEY
from trainforge.tune.search.optuna import OptunaSearch

optuna = pytest.importorskip("optuna")
FINISHED = Searcher.FINISHED


@pytest.fixture(autouse=True)
def _quiet_optuna():
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(level)


def drain(searcher: Searcher, prefix: str = "t", complete: bool = True) -> list[dict]:
    """Suggest until FINISHED, completing each trial at once; the configs in order."""
    configs = []
    while True:
        trial_id = f"{prefix}{len(configs)}"
        config = searcher.suggest(trial_id)
        if config == FINISHED:
            return configs
        assert isinstance(config, dict)
        configs.append(config)
        if complete:
            searcher.on_trial_complete(trial_id, {"loss": 0.0})


def on_grid(value: float, q: float) -> bool:
    ratio = value / q
    return abs(ratio - round(ratio)) <= 1e-9 * max(1.0, abs(ratio))


# -- domains --------------------------------------------------------------------------------------------

bounds = st.tuples(st.floats(-1e3, 1e3), st.floats(1e-3, 1e3)).map(lambda t: (t[0], t[0] + t[1]))
seeds = st.integers(0, 2**32)


@given(bounds, seeds)
def test_uniform_stays_in_its_closed_range(lu, seed):
    lower, upper = lu
    rng = random.Random(seed)
    assert all(lower <= tune.uniform(lower, upper).sample(rng) <= upper for _ in range(50))


@given(st.floats(-1e6, 1e6), st.floats(1e-6, 1e6), st.floats(1e-4, 1e3), seeds)
def test_quniform_gives_multiples_of_q_within_bounds(lower, span, q, seed):
    upper = lower + span  # bounds need not be multiples of q (Ray requires it)
    try:
        domain = tune.quniform(lower, upper, q)
    except ValueError as exc:
        assert "no multiple of q" in str(exc) and math.floor(upper / q) * q < lower + 1e-9 * abs(lower)
        return
    rng = random.Random(seed)
    for _ in range(20):
        v = domain.sample(rng)
        assert lower <= v <= upper and on_grid(v, q)


def test_quniform_reaches_both_end_multiples_and_rounds_float_noise():
    domain = tune.quniform(0.3, 0.9, 0.1)
    values = {domain.sample(random.Random(i)) for i in range(400)}
    assert values == {0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}  # exact decimals, no 0.30000000000000004


@given(st.floats(1e-6, 10), st.floats(1.5, 1e4), seeds)
def test_loguniform_in_range_and_qloguniform_on_grid(lower, factor, seed):
    upper = lower * factor
    rng = random.Random(seed)
    assert all(lower <= tune.loguniform(lower, upper).sample(rng) <= upper for _ in range(30))
    q = lower
    domain = tune.qloguniform(lower, upper, q)
    for _ in range(30):
        v = domain.sample(rng)
        assert lower * (1 - 1e-9) <= v <= upper and on_grid(v, q)


def test_loguniform_is_log_distributed():
    rng = random.Random(0)
    samples = [tune.loguniform(1e-4, 1).sample(rng) for _ in range(4000)]
    below = sum(v < 1e-2 for v in samples) / len(samples)
    assert 0.45 < below < 0.55  # half the decades lie below 1e-2; uniform would give 1%


@given(st.integers(-100, 100), st.integers(1, 20), seeds)
def test_randint_is_half_open(lower, span, seed):
    rng = random.Random(seed)
    values = [tune.randint(lower, lower + span).sample(rng) for _ in range(30)]
    assert all(isinstance(v, int) and lower <= v < lower + span for v in values)


def test_randint_covers_lower_and_upper_minus_one_only():
    rng = random.Random(1)
    assert {tune.randint(3, 6).sample(rng) for _ in range(300)} == {3, 4, 5}


@given(st.integers(-100, 100), st.integers(0, 100), st.integers(1, 7), seeds)
def test_qrandint_gives_multiples_of_q_in_closed_range(lower, span, q, seed):
    upper = lower + span + q  # at least one multiple of q inside
    domain = tune.qrandint(lower, upper, q)
    rng = random.Random(seed)
    for _ in range(30):
        v = domain.sample(rng)
        assert isinstance(v, int) and lower <= v <= upper and v % q == 0


def test_qrandint_includes_upper_even_with_q_1():  # Ray's q=1 shortcut left the upper bound out
    rng = random.Random(2)
    assert {tune.qrandint(1, 3).sample(rng) for _ in range(300)} == {1, 2, 3}
    assert {tune.qrandint(0, 10, 5).sample(rng) for _ in range(300)} == {0, 5, 10}


@given(st.integers(1, 1000), st.integers(1, 10_000), seeds)
def test_lograndint_half_open_and_qlograndint_multiples(lower, span, seed):
    upper = lower + span
    rng = random.Random(seed)
    assert all(lower <= tune.lograndint(lower, upper).sample(rng) < upper for _ in range(30))
    q = max(1, span // 3)
    domain = tune.qlograndint(lower, upper, q)
    for _ in range(30):
        v = domain.sample(rng)
        assert lower <= v <= upper and v % q == 0


def test_randn_mean_and_sd_and_qrandn_grid():
    rng = random.Random(3)
    samples = [tune.randn(5, 2).sample(rng) for _ in range(5000)]
    mean = sum(samples) / len(samples)
    sd = math.sqrt(sum((v - mean) ** 2 for v in samples) / len(samples))
    assert abs(mean - 5) < 0.1 and abs(sd - 2) < 0.1
    assert all(on_grid(tune.qrandn(0, 3, 0.5).sample(rng), 0.5) for _ in range(100))


def test_choice_samples_every_category_as_a_copy():
    categories = ["a", {"lr": 1}, 3]
    domain = tune.choice(categories)
    rng = random.Random(4)
    values = [domain.sample(rng) for _ in range(200)]
    assert {json.dumps(v) for v in values} == {json.dumps(c) for c in categories}
    next(v for v in values if isinstance(v, dict))["lr"] = 99
    assert domain.categories[1] == {"lr": 1}


def test_grid_search_is_the_plain_ray_dict():
    assert tune.grid_search(x for x in (1, 2)) == {"grid_search": [1, 2]}
    assert tune.grid_search(("a",)) == {"grid_search": ["a"]}


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: tune.uniform(1, 1), ["uniform(", "lower=1", "upper=1", "lower must be < upper"]),
        (lambda: tune.uniform(2, 1), ["uniform(", "lower=2", "lower must be < upper"]),
        (lambda: tune.quniform(0, 1, 0), ["quniform(", "q=0", "q must be > 0"]),
        (lambda: tune.quniform(0.1, 0.2, 0.3), ["quniform(", "q=0.3", "no multiple of q"]),
        (lambda: tune.loguniform(0, 1), ["loguniform(", "lower=0", "0 < lower"]),
        (lambda: tune.loguniform(-3, -1), ["loguniform(", "lower=-3", "0 < lower"]),
        (lambda: tune.loguniform(1, 10, base=1), ["loguniform(", "base", "1"]),
        (lambda: tune.qloguniform(1, 10, -1), ["qloguniform(", "q=-1"]),
        (lambda: tune.randint(5, 5), ["randint(", "lower=5", "upper=5", "[lower, upper)"]),
        (lambda: tune.qrandint(0, 10, 0), ["qrandint(", "q=0", "positive"]),
        (lambda: tune.lograndint(0, 10), ["lograndint(", "lower=0", "0 < lower"]),
        (lambda: tune.qlograndint(5, 2, 1), ["qlograndint(", "lower=5", "upper=2"]),
        (lambda: tune.randn(0, 0), ["randn(", "sd=0", "sd must be > 0"]),
        (lambda: tune.qrandn(0, 1, 0), ["qrandn(", "q=0"]),
        (lambda: tune.choice([]), ["choice([])", "at least one"]),
        (lambda: tune.grid_search([]), ["grid_search([])", "at least one"]),
        (lambda: tune.sample_from(lambda a, b: 1), ["sample_from(", "one argument"]),
    ],
)
def test_bad_arguments_raise_naming_function_value_and_rule(build, words):
    with pytest.raises(ValueError) as info:
        build()
    for word in words:
        assert word in str(info.value)


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match="randint\\(\\): lower must be an int"):
        tune.randint(0.5, 3)
    with pytest.raises(TypeError, match="choice\\('abc'\\)"):
        tune.choice("abc")
    assert tune.randint(0, 1e3).upper == 1000  # integral floats are fine


def test_domain_repr_names_the_constructor():
    assert repr(tune.qrandint(1, 10, 3)) == "qrandint(1, 10, 3)"
    assert repr(tune.loguniform(1e-4, 1e-2)) == "loguniform(0.0001, 0.01)"
    assert repr(tune.choice([1, "a"])) == "choice([1, 'a'])"


# -- variants -------------------------------------------------------------------------------------------


def test_grid_order_is_rays_first_axis_fastest():
    # Ray's test_var.py testGridSearch: bar varies fastest (axes sorted by key path).
    space = {"foo": tune.grid_search([1, 2, 3]), "bar": tune.grid_search([True, False]), "baz": "asd"}
    got = [(c["bar"], c["foo"], c["baz"]) for c in generate_variants(space, 1, random.Random(0))]
    assert got == [(True, 1, "asd"), (False, 1, "asd"), (True, 2, "asd"), (False, 2, "asd"), (True, 3, "asd"), (False, 3, "asd")]  # fmt: skip


def test_nested_grid_axes_sort_by_path():
    space = {"z": tune.grid_search([1, 2]), "a": {"b": tune.grid_search(["x", "y"])}}
    got = [(c["a"]["b"], c["z"]) for c in generate_variants(space, 1, random.Random(0))]
    assert got == [("x", 1), ("y", 1), ("x", 2), ("y", 2)]  # ("a", "b") < ("z",): a/b is fastest


axis_lists = st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), min_size=0, max_size=3)


@given(axis_lists, st.integers(1, 3), seeds)
@settings(max_examples=examples(50))
def test_grid_product_repeated_num_samples_times_in_order(axes, num_samples, seed):
    space: dict[str, Any] = {f"k{i}": tune.grid_search(values) for i, values in enumerate(axes)}
    space["u"] = tune.uniform(0, 1)
    variants = list(generate_variants(space, num_samples, random.Random(seed)))
    # reference: itertools.product varies its last axis fastest; Ray varies the first (k0 < k1 < k2)
    expected_grid = [list(reversed(p)) for p in itertools.product(*reversed(axes))]
    assert len(variants) == count_variants(space, num_samples) == math.prod(map(len, axes)) * num_samples
    got = [[v[f"k{i}"] for i in range(len(axes))] for v in variants]
    assert got == expected_grid * num_samples
    assert all(0 <= v["u"] <= 1 for v in variants)


def test_domains_are_sampled_per_variant_and_constants_deep_copied():
    constant = {"layers": [64, 64]}
    space = {"lr": tune.uniform(0, 1), "model": constant, "g": tune.grid_search([1, 2])}
    variants = list(generate_variants(space, 3, random.Random(5)))
    assert len({v["lr"] for v in variants}) == 6
    variants[0]["model"]["layers"].append(1)
    assert constant == {"layers": [64, 64]} and variants[1]["model"] == {"layers": [64, 64]}


def test_same_rng_seed_same_variants():
    space = {"a": tune.uniform(0, 1), "b": tune.choice(list(range(100))), "c": tune.randn()}
    first = list(generate_variants(space, 5, random.Random(7)))
    assert first == list(generate_variants(space, 5, random.Random(7)))
    assert first != list(generate_variants(space, 5, random.Random(8)))


def test_domains_inside_lists_and_choices_are_resolved():
    space = {
        "layers": [tune.randint(1, 4), {"w": tune.uniform(0, 1)}],
        "opt": tune.choice([{"lr": tune.uniform(5, 6)}]),
    }
    config = resolve_variant(space, 0, random.Random(0))
    assert (
        1 <= config["layers"][0] < 4 and 0 <= config["layers"][1]["w"] <= 1 and 5 <= config["opt"]["lr"] <= 6
    )
    assert not has_unresolved(config)


def test_sample_from_reads_resolved_values_by_attribute_and_item():
    space = {
        "a": tune.randint(5, 10),
        "g": tune.grid_search([100, 200]),
        "model": {"width": tune.choice([8, 16])},
        "b": tune.sample_from(lambda spec: spec.config.a + spec.config.g),
        "c": tune.sample_from(lambda spec: spec["config"]["model"]["width"] * 2),
        "d": tune.sample_from(lambda: "no-arg"),
    }
    for config in generate_variants(space, 3, random.Random(0)):
        assert config["b"] == config["a"] + config["g"]
        assert config["c"] == config["model"]["width"] * 2
        assert config["d"] == "no-arg"


def test_sample_from_chains_resolve_in_dependency_order():
    space = {
        "x": tune.sample_from(lambda spec: spec.config.y + 1),  # needs y, which needs z
        "y": tune.sample_from(lambda spec: spec.config.nested.z * 10),
        "nested": {"z": tune.sample_from(lambda spec: spec.config.base)},
        "base": tune.uniform(1, 2),
    }
    config = resolve_variant(space, 0, random.Random(0))
    assert config["x"] == config["y"] + 1 == config["base"] * 10 + 1


def test_sample_from_cycle_and_errors_name_the_keys():
    cycle = {"p": tune.sample_from(lambda s: s.config.q), "q": tune.sample_from(lambda s: s.config.p)}
    with pytest.raises(ValueError, match=r"cycle.*param_space\[\"p\"\] reads param_space\[\"q\"\]"):
        resolve_variant(cycle, 0, random.Random(0))
    typo = {"lr": tune.uniform(0, 1), "wd": tune.sample_from(lambda s: s.config.lrr)}
    with pytest.raises(ValueError, match=r"param_space\[\"wd\"\].*no key 'lrr'.*'lr'"):
        resolve_variant(typo, 0, random.Random(0))


def _foreign(module: str, name: str) -> Any:
    return type(name, (), {"__module__": module, "__repr__": lambda self: f"<{name}>"})()


@pytest.mark.parametrize(
    "obj, what",
    [
        (_foreign("ray.tune.search.sample", "Float"), "Ray Tune"),
        (_foreign("hyperopt.pyll.base", "Apply"), "hyperopt"),
        (optuna.distributions.FloatDistribution(0, 1), "Optuna"),
    ],
)
def test_foreign_search_spaces_raise_with_the_key_path(obj, what):
    space = {"train_loop_config": {"lr": obj, "epochs": 3}}
    with pytest.raises(ValueError) as info:
        validate_param_space(space)
    message = str(info.value)
    assert 'param_space["train_loop_config"]["lr"]' in message and what in message
    assert "tune.uniform" in message and repr(obj) in message
    with pytest.raises(ValueError, match="train_loop_config"):
        list(generate_variants(space, 1, random.Random(0)))
    with pytest.raises(ValueError, match="train_loop_config"):
        BasicVariantGenerator().set_search_properties("m", "min", space)


def test_foreign_search_space_inside_a_list_names_the_index():
    with pytest.raises(ValueError, match=r'param_space\["layers"\]\[1\] is a Ray Tune'):
        validate_param_space({"layers": [1, _foreign("ray.tune.search.sample", "Integer")]})


def test_malformed_or_nested_grids_and_tuples_raise():
    with pytest.raises(ValueError, match="non-empty list"):
        validate_param_space({"a": {"grid_search": 3}})
    with pytest.raises(ValueError, match="inside a grid_search or choice"):
        validate_param_space({"a": tune.grid_search([tune.grid_search([1])])})
    with pytest.raises(ValueError, match="inside a tuple"):
        validate_param_space({"a": (tune.uniform(0, 1),)})


def test_flatten_and_unflatten():
    config = {"a": {"b": 1, "c": {"d": [1, 2]}}, "e": 2, "empty": {}}
    flat = flatten_config(config)
    assert flat == {"a/b": 1, "a/c/d": [1, 2], "e": 2, "empty": {}}
    assert unflatten_config(flat) == config
    assert {f"config/{k}": v for k, v in flatten_config(config).items()}["config/a/c/d"] == [1, 2]


nested = st.recursive(
    st.integers() | st.text(max_size=3),
    lambda children: st.dictionaries(
        st.text("abc", min_size=1, max_size=3), children, min_size=1, max_size=3
    ),
    max_leaves=10,
)


@given(st.dictionaries(st.text("xyz", min_size=1, max_size=3), nested, max_size=4))
def test_flatten_unflatten_round_trip(config):
    assert unflatten_config(flatten_config(config)) == config


def test_merge_config_replaces_grid_axes_and_domains():
    base = {"g": tune.grid_search([{"lr": 1}]), "d": tune.uniform(0, 1), "k": {"x": 1, "y": 2}}
    merged = merge_config(base, {"g": {"lr": 2}, "d": 0.5, "k": {"y": 3}})
    assert merged == {"g": {"lr": 2}, "d": 0.5, "k": {"x": 1, "y": 3}}
    assert not has_unresolved(merged)


# -- Searcher / BasicVariantGenerator ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["minimize", "MAX", 1])
def test_bad_mode_raises_naming_the_value(bad):
    with pytest.raises(ValueError, match=f"mode must be 'min' or 'max', got {bad!r}"):
        BasicVariantGenerator().set_search_properties("loss", bad, {})
    with pytest.raises(ValueError, match=repr(bad)):
        OptunaSearch(metric="loss", mode=bad)
    with pytest.raises(ValueError, match=repr(bad)):
        Searcher(mode=bad)


def test_set_search_properties_fills_unset_and_refuses_conflicts():
    searcher = OptunaSearch(metric="loss")
    searcher.set_search_properties("loss", "max", {"a": tune.uniform(0, 1)})
    assert (searcher.metric, searcher.mode) == ("loss", "max")
    with pytest.raises(ValueError, match="metric='loss'.*metric='acc'"):
        OptunaSearch(metric="loss").set_search_properties("acc", "max", {})


def test_basic_variant_generator_count_order_and_finished():
    space = {"a": tune.uniform(0, 1), "b": tune.grid_search([1, 2, 3])}
    gen = BasicVariantGenerator(random_state=0)
    assert gen.set_search_properties("loss", "min", space, num_samples=2)
    configs = drain(gen)
    assert [c["b"] for c in configs] == [1, 2, 3, 1, 2, 3]
    assert gen.suggest("again") == FINISHED


def test_points_to_evaluate_first_merged_like_ray():
    # Ray: each point uses one of num_samples; grid axes it leaves out are expanded; then the rest.
    space = {
        "a": tune.uniform(0, 1),
        "b": tune.grid_search([1, 2, 3]),
        "k": "const",
        "n": {"x": tune.randint(0, 5)},
    }
    points = [{"a": 0.5, "b": 1, "n": {"x": 40}}, {"a": 0.25}]
    gen = BasicVariantGenerator(points_to_evaluate=points, random_state=1)
    gen.set_search_properties("loss", "min", space, num_samples=3)
    configs = drain(gen)
    assert len(configs) == 1 + 3 + 3
    assert configs[0] == {"a": 0.5, "b": 1, "k": "const", "n": {"x": 40}}  # verbatim, even outside randint
    assert [(c["a"], c["b"]) for c in configs[1:4]] == [(0.25, 1), (0.25, 2), (0.25, 3)]
    assert all(0 <= c["n"]["x"] < 5 for c in configs[1:]) and all(c["k"] == "const" for c in configs)
    assert [c["b"] for c in configs[4:]] == [1, 2, 3] and all(c["a"] not in (0.5, 0.25) for c in configs[4:])
    assert points == [{"a": 0.5, "b": 1, "n": {"x": 40}}, {"a": 0.25}]  # not mutated


def test_points_beyond_num_samples_still_run_and_unknown_keys_raise():
    gen = BasicVariantGenerator(points_to_evaluate=[{"a": 1}, {"a": 2}, {"a": 3}])
    gen.set_search_properties("loss", "min", {"a": tune.randint(0, 10)}, num_samples=2)
    assert [c["a"] for c in drain(gen)] == [1, 2, 3]
    bad = BasicVariantGenerator(points_to_evaluate=[{"a": 1, "nested": {"typo": 1}}])
    with pytest.raises(ValueError, match=r'points_to_evaluate\[0\] sets config\["nested"\]\["typo"\]'):
        bad.set_search_properties("loss", "min", {"a": tune.randint(0, 10), "nested": {"ok": 1}})


def test_points_out_of_domain_warn_but_run(caplog):
    gen = BasicVariantGenerator(points_to_evaluate=[{"a": 42}])
    with caplog.at_level(logging.WARNING):
        gen.set_search_properties("loss", "min", {"a": tune.uniform(0, 1)})
    assert "42" in caplog.text and "uniform(0, 1)" in caplog.text
    assert gen.suggest("t") == {"a": 42}


@given(st.integers(0, 12), seeds)
@settings(max_examples=examples(30))
def test_basic_variant_state_restore_continues_without_repeating(stop_after, seed):
    space = {"a": tune.uniform(0, 1), "b": tune.grid_search([1, 2]), "c": tune.choice(list("xyz"))}
    points = [{"a": 2.0}]

    def fresh() -> BasicVariantGenerator:
        gen = BasicVariantGenerator(points_to_evaluate=points, random_state=seed)
        gen.set_search_properties("loss", "min", space, num_samples=6)
        return gen

    uninterrupted = drain(fresh())
    first = fresh()
    head = [first.suggest(f"t{i}") for i in range(min(stop_after, len(uninterrupted)))]
    state = json.loads(json.dumps(first.get_state()))
    restored = fresh()
    restored.set_state(state)
    tail = drain(restored, prefix="u")
    assert head + tail == uninterrupted
    assert len({json.dumps(c, sort_keys=True) for c in uninterrupted}) == len(uninterrupted) == 12


def test_reasking_a_trial_id_returns_its_config_and_hands_out_nothing_new():
    gen = BasicVariantGenerator(random_state=3)
    gen.set_search_properties("loss", "min", {"a": tune.uniform(0, 1)}, num_samples=2)
    first = gen.suggest("t0")
    state = gen.get_state()
    restored = BasicVariantGenerator(random_state=99)
    restored.set_search_properties("loss", "min", {"a": tune.uniform(0, 1)}, num_samples=2)
    restored.set_state(state)
    assert restored.suggest("t0") == first == gen.suggest("t0")
    second = restored.suggest("t1")
    assert second != first and restored.suggest("t2") == FINISHED


def test_restore_with_another_space_is_refused():
    gen = BasicVariantGenerator()
    gen.set_search_properties("loss", "min", {"a": tune.grid_search([1, 2])})
    other = BasicVariantGenerator()
    other.set_search_properties("loss", "min", {"a": tune.grid_search([1, 2, 3])})
    with pytest.raises(ValueError, match="saved for 2 variants.*now give 3"):
        other.set_state(gen.get_state())


def test_basic_variant_max_concurrent():
    gen = BasicVariantGenerator(max_concurrent=2)
    gen.set_search_properties("loss", "min", {"a": tune.uniform(0, 1)}, num_samples=4)
    assert isinstance(gen.suggest("a"), dict) and isinstance(gen.suggest("b"), dict)
    assert gen.suggest("c") is None
    gen.on_trial_complete("a")
    assert isinstance(gen.suggest("c"), dict) and gen.suggest("d") is None


def test_searcher_base_adopts_space_and_refuses_a_second():
    class Fixed(Searcher):
        pass

    searcher = Fixed()
    assert searcher.set_search_properties("m", "max", {"a": 1}, num_samples=4)
    assert searcher._space == {"a": 1} and searcher._num_samples == 4
    assert not searcher.set_search_properties(None, None, {"b": 2})
    assert searcher.set_search_properties(None, None, {})
    with pytest.raises(NotImplementedError):
        searcher.suggest("x")


# -- ConcurrencyLimiter -------------------------------------------------------------------------------------


@given(st.integers(1, 4), st.lists(st.booleans(), max_size=60), seeds)
@settings(max_examples=examples(60))
def test_concurrency_cap_is_never_exceeded(cap, actions, seed):
    inner = BasicVariantGenerator(random_state=seed)
    limiter = ConcurrencyLimiter(inner, max_concurrent=cap)
    limiter.set_search_properties("loss", "min", {"a": tune.uniform(0, 1)}, num_samples=10)
    live: list[str] = []
    handed = 0
    rng = random.Random(seed)
    for start in actions + [False] * 30 + [True] * 30:
        if start or not live:
            suggestion = limiter.suggest(f"t{handed}")
            if isinstance(suggestion, dict):
                live.append(f"t{handed}")
                handed += 1
            elif suggestion is None:
                assert len(live) == cap  # None only at the cap
            else:
                assert suggestion == FINISHED and handed == 10
        else:
            limiter.on_trial_complete(live.pop(rng.randrange(len(live))), {"loss": 1.0})
        assert len(live) <= cap
    assert handed == 10


def test_concurrency_limiter_batch_waits_for_the_whole_batch():
    completed: list[str] = []

    class Recorder(BasicVariantGenerator):
        def on_trial_complete(self, trial_id, result=None, error=False):
            completed.append(trial_id)
            super().on_trial_complete(trial_id, result, error)

    limiter = ConcurrencyLimiter(Recorder(), max_concurrent=2, batch=True)
    limiter.set_search_properties("loss", "min", {"a": tune.uniform(0, 1)}, num_samples=4)
    assert isinstance(limiter.suggest("a"), dict) and isinstance(limiter.suggest("b"), dict)
    limiter.on_trial_complete("a", {"loss": 1})
    assert limiter.suggest("c") is None and completed == []
    limiter.on_trial_complete("b", {"loss": 2})
    assert completed == ["a", "b"] and isinstance(limiter.suggest("c"), dict)


def test_concurrency_limiter_state_round_trip_and_validation():
    limiter = ConcurrencyLimiter(BasicVariantGenerator(random_state=1), max_concurrent=1)
    limiter.set_search_properties("loss", "min", {"a": tune.uniform(0, 1)}, num_samples=3)
    first = limiter.suggest("a")
    state = json.loads(json.dumps(limiter.get_state()))
    restored = ConcurrencyLimiter(BasicVariantGenerator(random_state=1), max_concurrent=1)
    restored.set_search_properties("loss", "min", {"a": tune.uniform(0, 1)}, num_samples=3)
    restored.set_state(state)
    assert restored.suggest("b") is None  # "a" is still live after the restore
    assert restored.suggest("a") == first  # re-asked: same config, no new slot
    restored.on_trial_complete("a")
    assert isinstance(restored.suggest("b"), dict)
    with pytest.raises(ValueError, match="max_concurrent must be an int >= 1, got 0"):
        ConcurrencyLimiter(BasicVariantGenerator(), 0)
    with pytest.raises(TypeError, match="must be a Searcher"):
        ConcurrencyLimiter(object(), 1)  # type: ignore[arg-type]


# -- OptunaSearch ---------------------------------------------------------------------------------------------


def optuna_search(space: dict, num_samples: int = 1, **kwargs: Any) -> OptunaSearch:
    kwargs.setdefault("sampler", optuna.samplers.RandomSampler(seed=0))
    searcher = OptunaSearch(metric="loss", mode="min", **kwargs)
    assert searcher.set_search_properties(None, None, space, num_samples=num_samples)
    return searcher


def test_domains_convert_to_optuna_distributions():
    D = optuna.distributions
    space = {
        "u": tune.uniform(0, 1),
        "lu": tune.loguniform(1e-4, 1e-1),
        "qu": tune.quniform(0, 1, 0.25),
        "ri": tune.randint(1, 5),
        "qri": tune.qrandint(0, 10, 5),
        "lri": tune.lograndint(1, 100),
        "c": tune.choice(["a", "b"]),
        "nested": {"g": tune.grid_search([1, 2])},
        "const": 7,
    }
    searcher = optuna_search(space)
    config = searcher.suggest("t0")
    assert searcher.study.trials[0].distributions == {
        "u": D.FloatDistribution(0, 1),
        "lu": D.FloatDistribution(1e-4, 1e-1, log=True),
        "qu": D.FloatDistribution(0, 1, step=0.25),
        "ri": D.IntDistribution(1, 4),
        "qri": D.IntDistribution(0, 10, step=5),
        "lri": D.IntDistribution(1, 99, log=True),
        "c": D.CategoricalDistribution(["a", "b"]),
        "nested/g": D.CategoricalDistribution([1, 2]),
    }
    assert config["const"] == 7 and config["nested"]["g"] == 1 and set(config) == set(space)


@pytest.mark.parametrize(
    "domain, why", [(tune.randn(), "no normal distribution"), (tune.sample_from(lambda s: 1), "sample_from")]
)
def test_unconvertible_domains_raise_naming_the_key(domain, why):
    with pytest.raises(ValueError) as info:
        optuna_search({"model": {"x": domain}})
    assert 'param_space["model"]["x"]' in str(info.value) and why in str(info.value)


def test_optuna_configs_follow_domain_semantics():
    space = {
        "qlu": tune.qloguniform(1, 1000, 5),
        "qlri": tune.qlograndint(1, 1000, 7),
        "qu": tune.quniform(0.3, 0.9, 0.1),
        "opt": tune.choice([{"name": "adam"}, {"name": "sgd"}]),  # not storable: indices
    }
    configs = drain(optuna_search(space, num_samples=40))
    assert len(configs) == 40
    for c in configs:
        assert 5 <= c["qlu"] <= 1000 and on_grid(c["qlu"], 5)
        assert 7 <= c["qlri"] <= 994 and c["qlri"] % 7 == 0
        assert c["qu"] in {0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}
        assert c["opt"] in ({"name": "adam"}, {"name": "sgd"})
    assert {c["opt"]["name"] for c in configs} == {"adam", "sgd"}


def test_optuna_points_to_evaluate_run_first_verbatim():  # ray#35319: Ray ignored them
    space = {"x": tune.uniform(0, 1), "act": tune.choice(["relu", "tanh"]), "m": {"w": tune.randint(1, 9)}}
    points = [{"x": 0.125, "act": "tanh", "m": {"w": 3}}, {"x": 5.0}, {"m/w": 8}]
    searcher = optuna_search(space, num_samples=5, points_to_evaluate=points)
    with pytest.warns(UserWarning, match="Fixed parameter x with value 5.0 is out of range"):
        configs = drain(searcher)
    assert len(configs) == 5
    assert configs[0] == {"x": 0.125, "act": "tanh", "m": {"w": 3}}
    assert configs[1]["x"] == 5.0 and configs[1]["act"] in ("relu", "tanh")  # verbatim, out of range too
    assert configs[2]["m"]["w"] == 8
    assert [t.params["x"] for t in searcher.study.trials[:2]] == [0.125, 5.0]


def test_optuna_points_with_unknown_keys_or_categories_raise():
    with pytest.raises(ValueError, match="not one of"):
        optuna_search({"act": tune.choice(["relu"])}, points_to_evaluate=[{"act": "gelu"}])
    with pytest.raises(ValueError, match=r'points_to_evaluate\[0\] sets config\["lrr"\]'):
        optuna_search({"lr": tune.uniform(0, 1)}, points_to_evaluate=[{"lrr": 0.1}])


def test_optuna_grid_points_each_run_num_samples_times_in_grid_order():
    space = {"g": tune.grid_search(["a", "b", "c"]), "h": tune.grid_search([1, 2]), "x": tune.uniform(0, 1)}
    searcher = optuna_search(space, num_samples=2, sampler=optuna.samplers.TPESampler(seed=0))
    configs = drain(searcher)
    assert len(configs) == grid_size(space) * 2 == 6 * 2
    grid = [(c["g"], c["h"]) for c in configs]
    assert grid[:6] == [("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("c", 2)] and grid[6:] == grid[:6]
    assert searcher.suggest("more") == FINISHED


def test_optuna_ask_tell_states_and_intermediate_values():
    searcher = optuna_search({"x": tune.uniform(0, 1)}, num_samples=5)
    for tid in "abcde":
        searcher.suggest(tid)
    for step in (1, 2, 3):
        searcher.on_trial_result("a", {"loss": 10.0 - step, "training_iteration": step})
    searcher.on_trial_result("b", {"loss": 4.0})
    searcher.on_trial_result("b", {"other": 1})
    searcher.on_trial_result("b", {"loss": 3.0})
    searcher.on_trial_complete("a", {"loss": 7.0, "training_iteration": 3})
    searcher.on_trial_complete("b", error=True)
    searcher.on_trial_complete("c", pruned=True)
    searcher.on_trial_complete("d", {"loss": 1.5, PRUNED_RESULT_KEY: True})
    searcher.on_trial_complete("e", {"acc": 1.0})  # never reported the metric
    trials = searcher.study.trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "PRUNED", "PRUNED", "FAIL"]
    assert trials[0].value == 7.0 and trials[0].intermediate_values == {1: 9.0, 2: 8.0, 3: 7.0}
    assert trials[1].intermediate_values == {1: 4.0, 3: 3.0}  # steps count results without a step key


def test_optuna_num_samples_finishes_and_live_trials_count():
    searcher = optuna_search({"x": tune.uniform(0, 1)}, num_samples=3)
    assert all(isinstance(searcher.suggest(t), dict) for t in "abc")
    assert searcher.suggest("d") == FINISHED
    assert searcher.suggest("a") == searcher.suggest("a")  # re-asking is no new suggestion
    assert len(searcher.study.trials) == 3


def _quadratic_best(sampler: Any, trials: int = 40) -> float:
    searcher = OptunaSearch(metric="loss", mode="min", sampler=sampler)
    searcher.set_search_properties(
        None, None, {"x": tune.uniform(-10, 10), "y": tune.uniform(-10, 10)}, num_samples=trials
    )
    best = math.inf
    for i in range(trials):
        config = searcher.suggest(f"t{i}")
        assert isinstance(config, dict)
        loss = (config["x"] - 3) ** 2 + (config["y"] + 2) ** 2
        searcher.on_trial_complete(f"t{i}", {"loss": loss})
        best = min(best, loss)
    assert searcher.suggest("extra") == FINISHED
    return best


def test_tpe_finds_the_quadratics_minimum_better_than_random():
    tpe = [_quadratic_best(optuna.samplers.TPESampler(seed=seed)) for seed in range(5)]
    rnd = [_quadratic_best(optuna.samplers.RandomSampler(seed=seed)) for seed in range(5)]
    assert sum(a < b for a, b in zip(tpe, rnd, strict=True)) >= 4
    assert sum(tpe) / 5 < 0.5 * sum(rnd) / 5 and min(tpe) < 0.1


def test_optuna_seed_makes_suggestions_reproducible():
    def run(seed: int) -> list[dict]:
        searcher = OptunaSearch(metric="loss", mode="max", seed=seed)
        searcher.set_search_properties(None, None, {"x": tune.uniform(0, 1)}, num_samples=15)
        configs = []
        for i in range(15):
            configs.append(searcher.suggest(str(i)))
            searcher.on_trial_complete(str(i), {"loss": configs[-1]["x"]})
        return configs

    assert run(1) == run(1) != run(2)


def _optuna_round(searcher: OptunaSearch, ids: str, done: str) -> dict[str, dict]:
    configs = {tid: searcher.suggest(tid) for tid in ids}
    for tid in ids:
        searcher.on_trial_result(tid, {"loss": configs[tid]["x"], "training_iteration": 1})
        if tid in done:
            searcher.on_trial_complete(tid, {"loss": configs[tid]["x"]}, error=tid == "c")
    return configs


SPACE = {"x": tune.uniform(0, 1), "g": tune.grid_search(["p", "q"]), "k": 3}


def test_optuna_state_restore_continues_the_same_study():
    searcher = optuna_search(SPACE, num_samples=4, seed=None, points_to_evaluate=[{"x": 0.5}])
    configs = _optuna_round(searcher, "abcde", done="abc")  # d and e stay live
    state = json.loads(json.dumps(searcher.get_state()))
    before = [(t.params, t.state.name, t.value) for t in searcher.study.trials if t.state.name != "RUNNING"]

    restored = optuna_search(SPACE, num_samples=4, points_to_evaluate=[{"x": 0.5}])
    restored.set_state(state)
    trials = restored.study.trials
    assert [(t.params, t.state.name, t.value) for t in trials if t.state.name != "RUNNING"] == before
    live = [t for t in trials if t.state.name == "RUNNING"]
    assert sorted(t.user_attrs["trainforge_trial_id"] for t in live) == ["d", "e"]
    assert all(t.intermediate_values == {1: t.params["x"]} for t in live)
    assert restored.suggest("d") == configs["d"] and restored.suggest("e") == configs["e"]  # re-asked
    rest = drain(restored, prefix="n")
    assert len(rest) == 8 - 5 and [c["g"] for c in rest] == ["q", "p", "q"]  # continues at suggestion 5
    assert all(c["x"] != 0.5 for c in rest)  # the point is not handed out again
    restored.on_trial_complete("d", {"loss": 0.25})
    assert [t.value for t in restored.study.trials if t.user_attrs["trainforge_trial_id"] == "d"] == [0.25]


def test_optuna_restore_with_a_persistent_storage_adds_no_duplicates(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    searcher = optuna_search(SPACE, num_samples=3, storage=storage, study_name="exp")
    _optuna_round(searcher, "abc", done="ab")
    state = json.loads(json.dumps(searcher.get_state()))
    del searcher  # the tuner process is gone; "c" was live

    restored = optuna_search(SPACE, num_samples=3, storage=storage, study_name="exp")
    restored.set_state(state)
    trials = optuna.load_study(study_name="exp", storage=storage).trials
    by_id = [(t.user_attrs["trainforge_trial_id"], t.state.name) for t in trials]
    assert by_id == [("a", "COMPLETE"), ("b", "COMPLETE"), ("c", "FAIL"), ("c", "RUNNING")]


def test_optuna_study_name_is_remembered_for_storage_without_name(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    searcher = optuna_search(SPACE, num_samples=2, storage=storage)
    _optuna_round(searcher, "ab", done="ab")
    state = json.loads(json.dumps(searcher.get_state()))
    restored = optuna_search(SPACE, num_samples=2, storage=storage)
    restored.set_state(state)
    assert restored.study.study_name == searcher.study.study_name and len(restored.study.trials) == 2


def test_evaluated_rewards_become_completed_trials_not_suggestions():
    points = [{"x": 0.1, "g": "p"}, {"x": 0.9, "g": "q"}]
    searcher = optuna_search(SPACE, num_samples=1, points_to_evaluate=points, evaluated_rewards=[1.0, 2.0])
    configs = drain(searcher)
    assert len(configs) == 2 and all(c["x"] not in (0.1, 0.9) for c in configs)
    told = [(t.params["x"], t.value) for t in searcher.study.trials[:2]]
    assert told == [(0.1, 1.0), (0.9, 2.0)]
    with pytest.raises(ValueError, match="2 values for 1 points_to_evaluate"):
        OptunaSearch(points_to_evaluate=[{"x": 1}], evaluated_rewards=[1.0, 2.0])


def test_optuna_own_space_is_not_replaced_by_param_space():
    searcher = OptunaSearch(space={"x": tune.uniform(0, 1)}, metric="loss", mode="min")
    assert not searcher.set_search_properties(None, None, {"y": tune.uniform(0, 1)}, num_samples=2)
    assert searcher.set_search_properties(None, None, {}, num_samples=2)
    assert set(searcher.suggest("a")) == {"x"}
    dist = optuna.distributions.IntDistribution(1, 3)
    native = OptunaSearch(space={"n": dist, "c": 1}, metric="loss", mode="min")
    config = native.suggest("a")
    assert config["c"] == 1 and 1 <= config["n"] <= 3


def test_optuna_needs_metric_and_mode():
    searcher = OptunaSearch(space={"x": tune.uniform(0, 1)})
    with pytest.raises(ValueError, match="needs a metric and a mode.*TuneConfig"):
        searcher.suggest("a")


def test_missing_optuna_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r'pip install "trainforge\[tune\]"'):
        OptunaSearch()


def test_importing_the_search_package_does_not_import_optuna():
    code = "import sys, trainforge.tune.search, trainforge.tune.search.optuna; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
