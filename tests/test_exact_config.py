"""Exact expectations of the config's derived sizes (``fsedp.config``) on numbers worked out
by hand: token storage's share of each chiplet's buffer, the micro-slice slots a buffer
holds, the derived micro-slice count and count width, and the smallest buffer and count
that meet deadlock freedom -- each at its threshold, one below and one above; and the
loader's refusals, each with its exact file, field and reason."""

import copy
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny import TINY

from fsedp.config import (
    CONFIG_DIR,
    MAX_TOKENS_PER_ITERATION,
    HardwareConfig,
    _relative,
    _smallest,
    buffer_slots,
    config_path,
    config_to_dict,
    derived_count_width,
    derived_microslices,
    mesh_slots,
    run_from_dict,
    slot_cap,
    smallest_buffer_kib,
    smallest_microslices,
    token_kib,
    weight_kib,
)
from fsedp.errors import InputError
from fsedp.params import max_hops


def hw(storage=True, chiplets=4, kib=1000):
    return SimpleNamespace(token_storage=storage, chiplets=chiplets, onchip_buffer_kib=kib)


@pytest.mark.parametrize(
    "tokens, d_model, kib",
    [
        (1000, 1024, 1000),  # 250 tokens a chiplet x (in + out) x 1024 x 2 bytes = 1000 KiB
        (1001, 1024, 1004),  # 251 tokens (the share rounds up): 1004 KiB
        (997, 1024, 1000),  # 249.25 -> 250
        (4, 100, 1),  # 1 token: 400 bytes -> 1 KiB
        (20, 100, 2),  # 5 tokens: 2000 bytes -> 2 KiB
        (24, 128, 3),  # 6 tokens: 2 x 6 x 128 x 2 = 3072 bytes, exactly 3 KiB
    ],
)
def test_token_storage_share_of_a_chiplets_buffer(tokens, d_model, kib):
    m = SimpleNamespace(d_model=d_model)
    assert token_kib(hw(), m, tokens) == kib
    assert weight_kib(hw(kib=1000), m, tokens) == 1000 - kib
    assert token_kib(hw(storage=False), m, tokens) == 0
    assert weight_kib(hw(storage=False, kib=7), m, tokens) == 7


def test_token_storage_at_exactly_one_kib():
    """2 x 2 tokens of 128 activations: 1024 bytes, exactly 1 KiB; one activation more
    (d_model 129) takes a second KiB."""
    assert token_kib(hw(chiplets=1), SimpleNamespace(d_model=128), 2) == 1
    assert token_kib(hw(chiplets=1), SimpleNamespace(d_model=129), 2) == 2
    assert token_kib(hw(chiplets=2), SimpleNamespace(d_model=128), 4) == 1
    assert token_kib(hw(chiplets=2), SimpleNamespace(d_model=128), 5) == 2  # 3 on one


@pytest.mark.parametrize(
    "expert, kib, count, cap, slots",
    [
        (8192, 8, 8, 64, 8),  # 1 KiB slices: 8 of them
        (8192, 8, 7, 64, 6),  # slices of ceil(8192 / 7) = 1171 bytes: 8192 // 1171 = 6
        (8193, 8, 8, 64, 7),  # 1025-byte slices: one short
        (8192, 8, 64, 64, 64),  # 128-byte slices: 64, the cap
        (8192, 8, 128, 64, 64),  # 128 would fit: capped
        (8192, 8, 128, 71, 71),
    ],
)
def test_buffer_slots(expert, kib, count, cap, slots):
    assert buffer_slots(expert, kib, count, cap) == slots


def test_mesh_slots_and_slot_cap():
    assert max_hops(2, 2) == 3 and mesh_slots(2, 2) == 7  # 7 slots, more than 3 + 2
    assert max_hops(3, 3) + 2 == mesh_slots(3, 3) == 13
    assert max_hops(4, 4) + 2 == mesh_slots(4, 4) == 19
    assert slot_cap(2, 2) == 64 and slot_cap(8, 8) == max_hops(8, 8) + 2 == 71


def test_derived_microslices_by_hand():
    """A 64 KiB expert in a 64 KiB buffer, 7 slots: 7 slices of ceil(65536 / 7) = 9363
    bytes take 65541 > 65536 bytes: one short; 8 (the floor) hold 8 slots of 8 KiB."""
    assert derived_microslices(65536, 64) == 8
    # a 128 KiB expert, 7 slots: the quotient 131072 x 7 / 65536 = 14, but 14 slices of
    # ceil(131072 / 14) = 9363 bytes fit 6 times (7 take 65541 bytes); 15 of 8739 fit 7
    assert derived_microslices(131072, 64) == 15
    assert buffer_slots(131072, 64, 14) == 6 and buffer_slots(131072, 64, 15) == 7
    # 384 KiB: the quotient 42 (9363 bytes: 6 fit), 43 slices of 9145 bytes fit 7
    assert derived_microslices(131072 * 3, 64) == 43
    # the floor and the cap
    assert derived_microslices(1024, 1024, floor=5) == 5
    assert derived_microslices(10**9, 1) == 256


def test_derived_microslices_where_rounding_leaves_one_slot_short():
    """A 70001-byte expert, 64 KiB, 7 slots: the quotient gives ceil(70001 x 7 / 65536) = 8
    slices of 8751 bytes: 65536 // 8751 = 7 -- enough.  With 9 slots: ceil(9.61) = 10
    slices of 7001 bytes: 9 fit (63009)."""
    assert derived_microslices(70001, 64) == 8
    assert buffer_slots(70001, 64, 8) == 7 and buffer_slots(70001, 64, 7) == 6
    assert derived_microslices(70001, 64, slots=9) == 10
    # 65537 bytes x 7 slots / 64 KiB = 7.0001 -> 8 slices of 8193 bytes: 65536 // 8193 = 7
    assert derived_microslices(65537, 64, floor=1) == 8
    # 65536 x 7 / 65536 = 7 slices of 9363: 6 fit -> 8 slices of 8192: 8 fit
    assert derived_microslices(65536, 64, floor=1) == 8


def test_smallest_by_bisection():
    assert _smallest(1, 100, lambda x: x >= 37) == 37
    assert _smallest(1, 100, lambda x: x >= 1) == 1
    assert _smallest(1, 100, lambda x: x >= 100) == 100
    assert _smallest(1, 100, lambda x: False) is None
    assert _smallest(5, 5, lambda x: True) == 5


def test_smallest_buffer_and_count_meet_deadlock_freedom_exactly():
    """2 x 2 mesh: H = 3, 4 slots needed.  A 4096-byte expert in 8 slices of 512 bytes:
    4 slots take 2048 bytes: 2 KiB; in 4 slices of 1 KiB: 4 KiB."""
    assert smallest_buffer_kib(4096, 2, 2, 8) == 2
    assert smallest_buffer_kib(4096, 2, 2, 4) == 4
    assert buffer_slots(4096, 2, 8) == 4 and buffer_slots(4096, 1, 8) == 2
    # 1 KiB holds 4 slices of 256 bytes: 16 slices; 15 (274 bytes) hold 3
    assert smallest_microslices(4096, 1, 2, 2) == 16
    assert buffer_slots(4096, 1, 16) == 4 and buffer_slots(4096, 1, 15) == 3


@pytest.mark.parametrize(
    "tokens, width",
    [(1, 4), (15, 4), (16, 5), (31, 5), (32, 6), (255, 8), (256, 9), (65535, 16)],
)
def test_derived_count_width_holds_an_iteration(tokens, width):
    """The smallest width whose counts hold the iteration, at least 4 bits."""
    assert derived_count_width(tokens) == width
    assert 2**width - 1 >= tokens


def test_most_tokens_of_an_iteration():
    assert MAX_TOKENS_PER_ITERATION == 65535


def test_the_datapath_generics_of_the_tiny_run_by_hand():
    """The tiny run: 16 experts of 3 x 64 x 128 = 24 KiB (8-bit weights) in 8 micro-slices
    of 3 KiB; 800 MHz.  Slots: 24 KiB / 3 KiB = 8.  Link: 288 GB/s is 360 bytes a cycle:
    3072 / 360 = 8.5 -> 9, plus 4.02 ns = 3.2 -> 4 cycles: 13.  DDR: 4 x 25.6 GB/s is 128
    bytes a cycle: 24 cycles a micro-slice; 100 ns: 80 cycles.  A token on a micro-slice:
    3 x 64 x 128 / 8 MACs over 2048 MAC units: 1.5 -> 2 cycles."""
    cfg = run_from_dict(TINY, "tiny.yaml")
    assert cfg.model.expert_bytes == 24576 and cfg.microslice_bytes() == 3072
    dp = cfg.datapath_params()
    assert (dp.rows, dp.cols, dp.slots, dp.micro_slices) == (2, 2, 8, 8)
    assert (dp.link_cycles, dp.ddr_interval, dp.ddr_latency, dp.cycles_per_token) == (13, 24, 80, 2)
    assert cfg.datapath_params(slots=9).slots == 9


# -- refusals, each with its exact file, field and reason ------------------------------------


def run(**sections):
    """The tiny run with some sections' fields replaced (a section given as a mapping is
    merged into the tiny one's)."""
    data = copy.deepcopy(TINY)
    data["scheduler"] = {"requests": 8, "theta_min": 2, "n_threshold": 4, "qos_width": 4}
    data["scheduler"]["t_qos_init"] = 0
    for key, v in sections.items():
        data[key] = {**data[key], **v} if isinstance(v, dict) else v
    return data


def refusal(data, *args):
    with pytest.raises(InputError) as e:
        run_from_dict(data, *args)
    return e.value.file, e.value.field, e.value.reason


def test_a_package_of_one_chiplet_is_refused_with_its_product():
    data = run(hardware={"rows": 1, "cols": 1})
    assert refusal(data, "r.yaml") == (
        "r.yaml",
        "hardware.rows",
        "rows x cols = 1 x 1 = 1; a package has 2..64 chiplets",
    )


def test_top_k_may_equal_the_experts_but_not_exceed_them():
    assert run_from_dict(run(model={"top_k": 16})).model.top_k == 16
    assert refusal(run(model={"top_k": 17}), "r.yaml") == (
        "r.yaml",
        "model.top_k",
        "top_k = 17 exceeds experts = 16",
    )


def test_the_qos_timer_starts_at_most_at_its_widths_maximum():
    """qos_width 4: the timer holds 0..15."""
    cfg = run_from_dict(run(scheduler={"qos_width": 4, "t_qos_init": 15}))
    assert cfg.scheduler.t_qos_init == 15
    assert refusal(run(scheduler={"qos_width": 4, "t_qos_init": 16}), "r.yaml") == (
        "r.yaml",
        "scheduler.t_qos_init",
        "must be in 0..2**qos_width - 1 = 15, not 16",
    )


def test_ring_orders_and_ring_path_are_not_checked_as_scheduler_generics():
    """SchedulerParams would want the mesh columns for ring_orders 4 and the cycle path; the
    scheduler section leaves them to the link-aware strategies."""
    cfg = run_from_dict(run(scheduler={"ring_orders": 4, "ring_path": "cycle"}))
    assert (cfg.scheduler.ring_orders, cfg.scheduler.ring_path) == (4, "cycle")


def test_a_joint_scheduler_range_names_the_run_configs_field():
    """count_width 4 counts to 15: theta_min 16 is out of reach."""
    data = run(scheduler={"count_width": 4, "theta_min": 16}, scenario={"tokens_per_iteration": 8})
    assert refusal(data, "r.yaml") == (
        "r.yaml",
        "scheduler.theta_min",
        "must be in 0..2**count_width - 1 = 15, not 16",
    )


def test_a_synthetic_scenario_without_skew_names_the_file():
    data = run()
    del data["scenario"]["skew"]
    assert refusal(data, "r.yaml")[:2] == ("r.yaml", "scenario.skew")


@pytest.mark.parametrize("n, shown", [(80, "t" * 80), (81, "t" * 77 + "...")])
def test_a_trace_name_is_cut_after_80_characters(n, shown):
    data = run(scenario={"trace": "t" * n})
    assert refusal(data, "r.yaml") == (
        "r.yaml",
        "scenario.skew",
        f"applies to synthetic scenarios only; this scenario replays trace: {shown}",
    )


def test_a_pseudo_source_is_not_a_folder():
    """A source that starts with ``<`` is no file: a relative path stays relative to the
    current directory, even where the pseudo name holds a slash."""
    assert _relative("t.npz", "<some/pseudo>") == Path("t.npz")
    assert _relative("t.npz", "d/r.yaml") == Path("d/t.npz")
    assert _relative("/abs/t.npz", "d/r.yaml") == Path("/abs/t.npz")


@pytest.mark.parametrize("name", ["no/such", "no\\such", "nosuch.yml", "nosuch.yaml"])
def test_a_name_with_a_slash_or_a_yaml_suffix_is_a_path(name):
    with pytest.raises(InputError) as e:
        config_path("hardware", name)
    assert (e.value.file, e.value.field, e.value.reason) == (
        "<memory>",
        "hardware",
        f"no config file {name}",
    )


def test_a_long_missing_path_is_cut_at_200_characters():
    name = "d" * 100 + "/" + "e" * 150 + ".yaml"
    with pytest.raises(InputError) as e:
        config_path("hardware", name, "r.yaml", "hw")
    assert (e.value.file, e.value.field, e.value.reason) == (
        "r.yaml",
        "hw",
        f"no config file {name[:200]}",
    )


@pytest.mark.parametrize("name", ["a\0b.yaml", "a" * 250 + "\0.yaml"])
def test_a_nul_in_a_path_is_not_a_usable_path(name):
    with pytest.raises(InputError) as e:
        config_path("hardware", name, "r.yaml", "hw")
    assert (e.value.file, e.value.field, e.value.reason) == (
        "r.yaml",
        "hw",
        f"cannot look at {name[:200]}: not a usable path",
    )


def test_a_long_folder_path_is_cut_at_200_characters(tmp_path):
    d = tmp_path / ("f" * 100) / ("g" * 100 + ".yaml")
    d.mkdir(parents=True)
    with pytest.raises(InputError) as e:
        config_path("hardware", str(d), "r.yaml", "hw")
    assert len(str(d)) > 200
    assert e.value.reason == f"{str(d)[:200]} is a folder, not a regular file"


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(InputError) as e:
        config_path("hardware", "x" * 70, "r.yaml", "hw")
    assert (e.value.file, e.value.field, e.value.reason) == (
        "r.yaml",
        "hw",
        f"unknown hw config {'x' * 60!r}; known: chip2x2, mesh3x3, mesh3x3-16mib, "
        "mesh4x4, mesh4x4-16mib, mesh8x8 (or give a file path ending in .yaml)",
    )
    with pytest.raises(InputError) as e:
        config_path("nokind", "x")
    assert e.value.reason == (
        f"unknown nokind config 'x'; known: none: {CONFIG_DIR / 'nokind'} is empty or absent "
        "(or give a file path ending in .yaml)"
    )


def test_config_to_dict_refuses_a_class_and_skips_none_fields():
    with pytest.raises(TypeError, match="^not a config dataclass: <class "):
        config_to_dict(HardwareConfig)
    with pytest.raises(TypeError, match="^not a config dataclass: 5$"):
        config_to_dict(5)
    data = run(scenario={"trace": "model"})
    del data["scenario"]["skew"], data["scenario"]["prefill_fraction"]
    out = config_to_dict(run_from_dict(data).scenario)
    assert out == {
        "tokens_per_iteration": 64,
        "rounds": 2,
        "seed": 5,
        "trace": "model",
        "sharding": "token",
    }


def test_a_name_too_long_for_the_system_says_why():
    name = "a" * 300 + ".yaml"
    with pytest.raises(InputError) as e:
        config_path("hardware", name, "r.yaml", "hw")
    assert e.value.reason == f"cannot look at {name[:200]}: File name too long"


SECTIONS = "hardware, model, scheduler, scenario"


@pytest.mark.parametrize(
    "change, field, reason",
    [
        (lambda d: [1], "<top>", "the top level must be a mapping, not a list"),
        (lambda d: {**d, "k" * 70: 1}, "k" * 60, "unknown key; allowed keys: " + SECTIONS),
        (
            lambda d: {k: v for k, v in d.items() if k != "model"},
            "model",
            f"missing key (required keys: {SECTIONS})",
        ),
        (
            lambda d: {**d, "hardware": 5},
            "hardware",
            "must be a mapping of fields, the name of a config in configs/hardware/ or a file "
            "path, not int 5",
        ),
        (lambda d: {**d, "scenario": "x"}, "scenario", "must be a mapping of fields, not str 'x'"),
    ],
)
def test_the_top_level_refusals(change, field, reason):
    data = change(copy.deepcopy(TINY))
    with pytest.raises(InputError) as e:
        run_from_dict(data)
    assert (e.value.file, e.value.field, e.value.reason) == ("<memory>", field, reason)


def test_the_scheduler_generics_come_from_the_scheduler_section():
    sp = run_from_dict(
        run(scheduler={"requests": 5, "theta_min": 3, "n_threshold": 6, "qos_width": 5})
    ).scheduler_params()
    assert (sp.requests, sp.theta_min, sp.n_threshold, sp.qos_width) == (5, 3, 6, 5)


def test_the_scheduler_refusals_name_the_run_configs_field():
    """1 x 2 is a package (2 chiplets) but not a scheduler's (4..64); 4 experts are a model
    but not a scheduler's (8..256)."""
    assert refusal(run(hardware={"rows": 1}), "r.yaml") == (
        "r.yaml",
        "hardware",
        "rows x cols = 1 x 2 = 2, but the scheduler's chiplets must be in 4..64, not 2",
    )
    assert refusal(run(model={"experts": 4}), "r.yaml") == (
        "r.yaml",
        "model.experts",
        "must be in 8..256, not 4",
    )


def test_a_derived_count_in_the_one_kib_tokens_leave():
    """368 tokens on 4 chiplets: 92 each, 2 x 92 x 64 x 2 bytes = 23 KiB of the 24: 1 KiB for
    7 micro-slices of a 24576-byte expert: 169 slices of 146 bytes (7 x 146 = 1022); 168
    slices of 147 bytes fit 6.  The buffer check takes that one KiB."""
    data = run(
        hardware={"token_storage": True, "microslices_per_expert": None},
        scenario={"tokens_per_iteration": 368},
    )
    del data["hardware"]["microslices_per_expert"]
    cfg = run_from_dict(data)
    assert (cfg.token_kib, cfg.weight_kib, cfg.hardware.microslices_per_expert) == (23, 1, 169)
    assert buffer_slots(24576, 1, 169) == 7 and buffer_slots(24576, 1, 168) == 6


def test_the_smallest_count_may_be_one_and_may_need_more_than_64_slots():
    """A 1 KiB expert whole, 4 of them in 4 KiB: 2x2's 4 slots.  8x8 needs 70 slots (more
    than 64): 7168 bytes hold 70 slices of 102 bytes, ceil(7000 / 69); 68 slices of 103
    bytes fit 69."""
    assert smallest_microslices(1024, 4, 2, 2) == 1
    assert smallest_microslices(7000, 7, 8, 8) == 69


NEEDS = "but a 2x2 mesh needs at least 4 per chiplet for deadlock-free streaming"


@pytest.mark.parametrize(
    "hardware, model, tokens, reason",
    [
        # 12 KiB less 1 KiB of 16 tokens (4 a chiplet x 2 x 64 x 2 bytes): 3 slices of 3 KiB;
        # 4 need 12 KiB (+1 of tokens), or 9 slices of 2731 bytes fit 4 in 11 KiB
        (
            {"onchip_buffer_kib": 12},
            {},
            16,
            f"11 KiB left by 1 KiB of tokens holds 3 micro-slices of 3 KiB "
            f"(microslices_per_expert 8), {NEEDS}; hardware.onchip_buffer_kib >= 13 or "
            "hardware.microslices_per_expert >= 9 would fit",
        ),
        # a 3 MiB expert (d 1024 x 1024), 4 tokens of 4 KiB: 256 slices of 12 KiB fit 4 in 48
        # KiB, no count in 47; 8 slices of 384 KiB need 1536 KiB
        (
            {"onchip_buffer_kib": 51, "microslices_per_expert": 8},
            {"d_model": 1024, "d_ffn": 1024},
            4,
            f"47 KiB left by 4 KiB of tokens holds 0 micro-slices of 384 KiB "
            f"(microslices_per_expert 8), {NEEDS}; hardware.onchip_buffer_kib >= 1540 would fit "
            "(no microslices_per_expert up to 256 does; >= 52 with microslices_per_expert left "
            "out)",
        ),
        # the same with 256 slices: the derived count's buffer is no smaller
        (
            {"onchip_buffer_kib": 51, "microslices_per_expert": 256},
            {"d_model": 1024, "d_ffn": 1024},
            4,
            f"47 KiB left by 4 KiB of tokens holds 3 micro-slices of 12 KiB "
            f"(microslices_per_expert 256), {NEEDS}; hardware.onchip_buffer_kib >= 52 would fit "
            "(no microslices_per_expert up to 256 does)",
        ),
        # a 384 MiB expert (8192 x 16384) whole: no buffer up to 1 GiB holds 4; 8 MiB holds 4
        # slices of 2 MiB, 192 of them
        (
            {"onchip_buffer_kib": 8192, "microslices_per_expert": 1, "token_storage": False},
            {"d_model": 8192, "d_ffn": 16384},
            4,
            f"8192 KiB holds 0 micro-slices of 393216 KiB (microslices_per_expert 1), {NEEDS}; "
            "hardware.microslices_per_expert >= 192 would fit (no onchip_buffer_kib up to "
            "1048576 does)",
        ),
        # 4096 KiB (+32 of 4 tokens of 8192 x 2 x 2 bytes): not even 256 slices of 1.5 MiB
        # fit 4; 6144 KiB do
        (
            {"onchip_buffer_kib": 4128, "microslices_per_expert": 1},
            {"d_model": 8192, "d_ffn": 16384},
            4,
            f"4096 KiB left by 32 KiB of tokens holds 0 micro-slices of 393216 KiB "
            f"(microslices_per_expert 1), {NEEDS}; hardware.onchip_buffer_kib >= 6176 with "
            "microslices_per_expert left out would fit (neither alone does)",
        ),
    ],
)
def test_the_buffer_refusals_hint(hardware, model, tokens, reason):
    data = run(
        hardware={"token_storage": True, **hardware},
        model=model,
        scenario={"tokens_per_iteration": tokens},
    )
    assert refusal(data) == ("<memory>", "hardware.onchip_buffer_kib", reason)


def test_no_buffer_fits_a_huge_expert_on_8x8():
    """70 slots of 256 slices of a 12 GiB expert (65536 x 65536) take 3.3 GiB: over 1 GiB."""
    data = run(
        hardware={"rows": 8, "cols": 8, "onchip_buffer_kib": 1024, "microslices_per_expert": 1},
        model={"d_model": 65536, "d_ffn": 65536},
    )
    assert refusal(data)[2].endswith(
        "no hardware.onchip_buffer_kib up to 1048576 fits this model on this mesh"
    )


def test_check_buffer_says_whether_the_count_was_derived():
    cfg = run_from_dict(TINY)
    small = dataclasses.replace(
        cfg, hardware=dataclasses.replace(cfg.hardware, onchip_buffer_kib=11)
    )
    with pytest.raises(InputError) as e:
        small.check_buffer()
    assert e.value.reason.startswith("11 KiB holds 3 micro-slices of 3 KiB (microslices_per_ex")
    with pytest.raises(InputError) as e:
        small.check_buffer(True)
    assert e.value.reason.startswith(
        f"11 KiB holds 3 micro-slices of 3 KiB (derived microslices_per_expert 8), {NEEDS};"
    )


def test_datapath_cycles_round_up_at_a_hair_over():
    """A 3072-byte slice over a link of 1.25 x 2457.6 / 10.000000005 bytes a cycle (800 MHz):
    10.000000005 cycles, 11; 1.25000001 ns at 800 MHz: 1.000000008 cycles, 2; 100 ns at
    800.01 MHz: 80.001 cycles, 81; 1024 MACs: 3 x 64 x 128 / 8 / 1024 = 3 cycles a token."""
    cfg = run_from_dict(TINY, "tiny.yaml")
    bw = 2457.6 / 10.000000005  # 3072 bytes over 1.25 bw bytes a cycle: 10.000000005

    def dp(**hw):
        return dataclasses.replace(
            cfg, hardware=dataclasses.replace(cfg.hardware, **hw)
        ).datapath_params()

    assert dp(d2d_bandwidth_gbps=bw, d2d_latency_ns=0.0).link_cycles == 11
    assert dp(d2d_latency_ns=1.25000001).link_cycles == 9 + 2
    assert dp(ddr_channels=1, ddr_bandwidth_gbps_per_channel=bw).ddr_interval == 11
    assert dp(clock_mhz=800.01).ddr_latency == 81
    assert dp(macs_per_chiplet=1024).cycles_per_token == 3
    with pytest.raises(InputError) as e:
        cfg.datapath_params(slots=0)
    assert (e.value.file, e.value.field, e.value.reason) == (
        "tiny.yaml",
        "<datapath>.slots",
        "must be in 2..256, not 0",
    )
