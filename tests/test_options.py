"""Option sets declared once (`inference.options`): validation names the option, each surface spells it its own way."""

import argparse

import pytest

from inference import kernels, options
from inference.engine import EngineConfig
from inference.options import CLI, ENV, OLLAMA, OPENAI, OptionError
from inference.sampler import SamplingParams


def test_an_engine_option_out_of_range_names_the_option_not_a_flag():
    with pytest.raises(OptionError) as e:
        EngineConfig(expert_slots=0)
    assert e.value.field == "expert_slots" and str(e.value) == "expert_slots=0 is out of range; allowed: an integer ≥ 1"
    assert CLI.error(e.value).startswith("--expert-slots=0 ")
    assert ENV.error(e.value).startswith("RKMOJO_EXPERT_SLOTS=0 ")


@pytest.mark.parametrize(
    "field, value", [("policy", "fifo"), ("io", "mmap"), ("kv_dtype", "bf16"), ("threads", True), ("context", 0)]
)
def test_every_engine_option_is_checked_by_its_declaration(field, value):
    with pytest.raises(OptionError) as e:
        EngineConfig(**{field: value})
    assert e.value.field == field


def test_the_config_is_frozen_and_a_budget_given_as_text_is_bytes():
    cfg = EngineConfig(memory_budget="1.5G")
    assert cfg.memory_budget == int(1.5 * 2**30)
    with pytest.raises(AttributeError):
        cfg.expert_slots = 4


def test_each_surface_spells_the_option_as_its_clients_do():
    e = OptionError("max_tokens", 0, "an integer ≥ 1")
    assert [s.spell(e.field) for s in (OPENAI, OLLAMA, CLI, ENV)] == [
        "max_tokens",
        "options.num_predict",
        "--max-tokens",
        "RKMOJO_MAX_TOKENS",
    ]
    assert OLLAMA.spell("repetition_penalty") == "options.repeat_penalty"
    assert CLI.spell("repetition_penalty") == "--repeat-penalty" and CLI.spell("policy") == "--cache-policy"


def test_flags_and_environment_come_from_the_same_declaration():
    p = argparse.ArgumentParser()
    options.add_flags(p, EngineConfig)
    assert options.from_flags(EngineConfig, p.parse_args(["--expert-slots", "6", "--cache-policy", "lru"])) == {
        "expert_slots": 6,
        "policy": "lru",
    }
    assert options.from_env(EngineConfig, {"RKMOJO_MEMORY_BUDGET": "2G", "RKMOJO_THREADS": " "}) == {
        "memory_budget": 2 * 2**30
    }
    with pytest.raises(ValueError, match=r"^RKMOJO_TOP_P='1\.5' is out of range; allowed: \(0, 1\]$"):
        options.from_env(SamplingParams, {"RKMOJO_TOP_P": "1.5"})
    with pytest.raises(ValueError, match=r"^RKMOJO_SEED='x' is out of range; allowed: an integer ≥ 0$"):
        options.from_env(SamplingParams, {"RKMOJO_SEED": "x"})


def test_an_on_off_option_reads_words_on_every_surface():
    p = argparse.ArgumentParser()
    options.add_flags(p, SamplingParams)
    assert options.from_flags(SamplingParams, p.parse_args(["--repetition-guard", "on"])) == {"repetition_guard": True}
    assert options.from_env(SamplingParams, {"RKMOJO_REPETITION_GUARD": "no"}) == {"repetition_guard": False}
    with pytest.raises(ValueError, match=r"^RKMOJO_REPETITION_GUARD='maybe': write on or off"):
        options.from_env(SamplingParams, {"RKMOJO_REPETITION_GUARD": "maybe"})
    with pytest.raises(OptionError, match=r"allowed: on or off$"):
        SamplingParams(repetition_guard=1)  # JSON's true, not a number


def test_an_engine_applies_its_thread_count_and_activations_to_its_own_compute_only():
    before = kernels.get_threads(), kernels.get_activations()
    other = "q8" if before[1] != "q8" else "f32"
    with kernels.configured(1, other):
        assert (kernels.get_threads(), kernels.get_activations()) == (1, other)
    assert (kernels.get_threads(), kernels.get_activations()) == before
    with pytest.raises(ValueError), kernels.configured(None, "int3"):
        pass
    assert (kernels.get_threads(), kernels.get_activations()) == before


def test_the_lookahead_slot_and_repack_settings_are_engine_options_on_every_surface():
    cfg = EngineConfig()
    assert (cfg.token_prefetch, cfg.hugepages, cfg.repack) == (3, True, True)
    p = argparse.ArgumentParser()
    options.add_flags(p, EngineConfig)
    flags = ["--token-prefetch", "0", "--hugepages", "off", "--repack", "off"]
    want = {"token_prefetch": 0, "hugepages": False, "repack": False}
    assert options.from_flags(EngineConfig, p.parse_args(flags)) == want
    env = {"RKMOJO_TOKEN_PREFETCH": "0", "RKMOJO_HUGEPAGES": "0", "RKMOJO_REPACK": "0"}
    assert options.from_env(EngineConfig, env) == want
    with pytest.raises(ValueError, match=r"^RKMOJO_TOKEN_PREFETCH='lots' is out of range; allowed: an integer ≥ 0$"):
        options.from_env(EngineConfig, {"RKMOJO_TOKEN_PREFETCH": "lots"})


def test_the_kernel_build_and_starting_activations_are_read_once_at_load_and_named_when_wrong():
    from inference.kernels._lib import KernelOptions

    assert KernelOptions.from_env({}) == KernelOptions("native", "decode")
    assert KernelOptions.from_env({"RKMOJO_KERNELS": "AVX2", "RKMOJO_ACTIVATIONS": "experts"}) == KernelOptions(
        "avx2", "experts"
    )
    with pytest.raises(ImportError, match=r"^RKMOJO_ACTIVATIONS='int3' is out of range; allowed: one of f32, q8"):
        KernelOptions.from_env({"RKMOJO_ACTIVATIONS": "int3"})
    assert kernels.LOADED == KernelOptions.from_env()  # what this process was loaded with
