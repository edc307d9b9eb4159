"""Device profiles (``sw/policies/device.py``) pinned by hand: every field's range at its
bounds, its unit in the refusal, its default; the expert table's checks word for word;
the unit conversions (us to seconds in ``table``); interpolation; the YAML text."""

import os
from pathlib import Path

import pytest

from fsedp.errors import COMMAND_LINE, InputError
from fsedp.fields import specs, table
from fsedp.sw.policies.device import (
    DEFAULT_DEVICE,
    TABLE_MAX,
    DeviceProfile,
    _check_table,
    _load_stamped,
    interpolate,
    load_device,
    profile_from_dict,
    profile_yaml,
)

F = "dev.yaml"
REQUIRED = {
    "name": "d",
    "link_gbs": 25.0,
    "link_latency_us": 10.0,
    "pinned": True,
    "expert_launch_us": 5.0,
    "expert_tflops": 50.0,
    "tflops": 150.0,
    "memory_gbs": 2000.0,
    "step_launch_us": 2000.0,
}


def refused(data, file=F) -> InputError:
    with pytest.raises(InputError) as e:
        profile_from_dict(data, file)
    return e.value


def with_(**kw) -> dict:
    return {**REQUIRED, **kw}


# ---------------------------------------------------------------- constants and defaults


def test_constants():
    assert DEFAULT_DEVICE == "pcie4-default"
    assert TABLE_MAX == 64


def test_defaults_of_the_optional_fields():
    """link_issue_us 0, expert_device_us absent, issue sync, no table, no source; the same
    from a mapping without them and from the constructor."""
    for p in (profile_from_dict(dict(REQUIRED), F), DeviceProfile(**REQUIRED)):
        assert p.link_issue_us == 0.0 and type(p.link_issue_us) is float
        assert p.expert_device_us is None
        assert p.issue == "sync"
        assert p.expert_table_us is None
        assert p.source is None
        assert p.table() is None
    explicit = with_(link_issue_us=0.0, issue="sync")
    assert profile_from_dict(explicit, F) == profile_from_dict(dict(REQUIRED), F)


def test_integers_are_stored_as_floats():
    p = profile_from_dict(with_(link_gbs=25, step_launch_us=0, expert_device_us=21), F)
    assert (p.link_gbs, p.step_launch_us, p.expert_device_us) == (25.0, 0.0, 21.0)
    assert type(p.link_gbs) is float and type(p.expert_device_us) is float


def test_as_dict_leaves_out_absent_fields_in_field_order():
    p = profile_from_dict(with_(source="s"), F)
    d = p.as_dict()
    assert list(d) == [*REQUIRED, "link_issue_us", "issue", "source"]
    assert d["link_issue_us"] == 0.0 and d["issue"] == "sync" and d["source"] == "s"


# ---------------------------------------------------------------- ranges at their bounds

# field, lowest accepted, highest accepted, refusal text below, refusal text above
BOUNDS = [
    ("link_gbs", 1e-3, 1e5, "0.001..100000 GB/s"),
    ("link_latency_us", 0.0, 1e6, "0..1e+06 us"),
    ("expert_launch_us", 0.0, 1e6, "0..1e+06 us"),
    ("expert_tflops", 1e-6, 1e5, "1e-06..100000 TFLOP/s"),
    ("tflops", 1e-6, 1e5, "1e-06..100000 TFLOP/s"),
    ("memory_gbs", 1e-3, 1e6, "0.001..1e+06 GB/s"),
    ("step_launch_us", 0.0, 1e8, "0..1e+08 us"),
    ("link_issue_us", 0.0, 1e6, "0..1e+06 us"),
    ("expert_device_us", 0.0, 1e6, "0..1e+06 us"),
]


@pytest.mark.parametrize("field,lo,hi,text", BOUNDS)
def test_each_range_takes_its_bounds(field, lo, hi, text):
    assert getattr(profile_from_dict(with_(**{field: lo}), F), field) == lo
    assert getattr(profile_from_dict(with_(**{field: hi}), F), field) == hi


@pytest.mark.parametrize("field,lo,hi,text", BOUNDS)
def test_each_range_refuses_beyond_its_bounds(field, lo, hi, text):
    """Just below the lowest (half of it, or -0.5 at 0) and 0.5 above the highest; the
    value shown to 3 significant digits."""
    below = lo / 2 if lo else -0.5
    e = refused(with_(**{field: below}))
    assert (e.file, e.field) == (F, field)
    assert e.reason == f"must be in {text}, not {below:.3g}"
    e = refused(with_(**{field: hi + 0.5}))
    assert e.reason == f"must be in {text}, not {hi + 0.5:.3g}"


def test_a_refusal_is_one_line_file_field_reason():
    e = refused(with_(link_gbs=0.0))
    assert str(e) == "dev.yaml: link_gbs: must be in 0.001..100000 GB/s, not 0"


def test_types_of_fields():
    e = refused(with_(pinned=1))
    assert (e.field, e.reason) == ("pinned", "must be true or false, not int 1")
    e = refused(with_(link_gbs=True))
    assert (e.field, e.reason) == ("link_gbs", "must be a number, not bool True")
    e = refused(with_(link_gbs=float("nan")))
    assert e.reason == "must be finite, not nan"
    e = refused(with_(name=""))
    assert (e.field, e.reason) == ("name", "must be a non-empty string")
    e = refused(with_(source=3))
    assert (e.field, e.reason) == ("source", "must be a string, not int 3")


def test_issue_takes_sync_or_async_only():
    assert profile_from_dict(with_(issue="async"), F).issue == "async"
    assert profile_from_dict(with_(issue="sync"), F).issue == "sync"
    e = refused(with_(issue="Async"))
    assert (e.field, e.reason) == ("issue", "must be one of sync, async, not 'Async'")


def test_missing_and_unknown_keys():
    data = dict(REQUIRED)
    del data["tflops"]
    e = refused(data)
    assert e.field == "tflops"
    assert e.reason == (
        "missing key (required keys: name, link_gbs, link_latency_us, pinned, "
        "expert_launch_us, expert_tflops, tflops, memory_gbs, step_launch_us)"
    )
    e = refused(with_(bandwidth=1.0))
    assert e.field == "bandwidth"
    assert e.reason == (
        "unknown key; allowed keys: name, link_gbs, link_latency_us, pinned, "
        "expert_launch_us, expert_tflops, tflops, memory_gbs, step_launch_us, "
        "link_issue_us, expert_device_us, issue, expert_table_us, source"
    )
    e = refused([1])
    assert (e.field, e.reason) == ("<top>", "must be a mapping of fields, not a list")


# ---------------------------------------------------------------- the expert table


def test_table_is_sorted_pairs_in_seconds():
    """{256: 50 us, 1: 40 us} -> ((1, 40e-6 s), (256, 50e-6 s)): the keys sorted, us times
    1e-6; integer us stored as floats."""
    p = profile_from_dict(with_(expert_table_us={256: 50, 1: 40.0}), F)
    assert p.expert_table_us == {256: 50.0, 1: 40.0}
    assert all(type(v) is float for v in p.expert_table_us.values())
    t = p.table()
    assert t == ((1, 40.0 * 1e-6), (256, 50.0 * 1e-6))
    assert t[0][1] == pytest.approx(40e-6, rel=1e-12)
    assert all(type(k) is int and type(s) is float for k, s in t)


def test_table_bounds_of_tokens_and_us():
    """tokens 1 and 2**20 = 1048576 and us 0 and 1e8 are taken."""
    t = {1: 0, 2**20: 1e8}
    assert _check_table(F, t) == {1: 0.0, 1048576: 1e8}
    assert profile_from_dict(with_(expert_table_us=t), F).expert_table_us == {1: 0.0, 2**20: 1e8}


def test_table_holds_at_most_64_entries():
    full = {k: 1.0 for k in range(1, 65)}
    assert len(profile_from_dict(with_(expert_table_us=full), F).expert_table_us) == 64
    e = refused(with_(expert_table_us={k: 1.0 for k in range(1, 66)}))
    assert (e.file, e.field, e.reason) == (F, "expert_table_us", "must hold 1..64 entries, not 65")


def test_table_must_be_a_non_empty_mapping():
    e = refused(with_(expert_table_us={}))
    assert (e.field, e.reason) == ("expert_table_us", "must be a non-empty mapping, not a dict")
    e = refused(with_(expert_table_us=[1]))
    assert e.reason == "must be a non-empty mapping, not a list"


@pytest.mark.parametrize(
    "key,field,shown",
    [
        (0, "expert_table_us.0", "int 0"),
        (2**20 + 1, "expert_table_us.1048577", "int 1048577"),
        (True, "expert_table_us.True", "bool True"),
        (2.0, "expert_table_us.2.0", "float 2.0"),
        ("x" * 70, "expert_table_us." + "x" * 40, "str '" + "x" * 56 + "..."),
        ("x" * 50, "expert_table_us." + "x" * 40, "str '" + "x" * 50 + "'"),
    ],
)
def test_table_tokens_must_be_integers_in_range(key, field, shown):
    """The field names the key cut to 40 characters; the value is described (type, repr
    cut to 57 characters and '...')."""
    e = refused(with_(expert_table_us={key: 1.0}))
    assert (e.file, e.field) == (F, field)
    assert e.reason == f"tokens must be an integer in 1..2**20, not {shown}"


@pytest.mark.parametrize(
    "us,reason",
    [
        (True, "must be a number of us, not bool True"),
        ("5", "must be a number of us, not str '5'"),
        (None, "must be a number of us, not NoneType None"),
        (-1, "must be in 0..1e+08 us, not -1"),
        (-0.5, "must be in 0..1e+08 us, not -0.5"),
        (100000001, "must be in 0..1e+08 us, not 100000001"),
        (float("inf"), "must be in 0..1e+08 us, not inf"),
        (float("nan"), "must be in 0..1e+08 us, not nan"),
    ],
)
def test_table_us_must_be_a_number_in_range(us, reason):
    e = refused(with_(expert_table_us={1: 1.0, 8: us}))
    assert (e.file, e.field, e.reason) == (F, "expert_table_us.8", reason)


# ---------------------------------------------------------------- interpolation


TABLE = ((1, 10e-6), (5, 30e-6))


def test_interpolate_linear_between_entries():
    """n 3 is halfway from 1 to 5: 10 + (30 - 10) * 2/4 = 20 us."""
    v = interpolate(TABLE, 3, 1e12, 1e6)
    assert v == pytest.approx(20e-6, rel=1e-12) and type(v) is float
    assert interpolate(TABLE, 2, 1e12, 1e6) == pytest.approx(15e-6, rel=1e-12)


def test_interpolate_flat_below_the_first_and_exact_at_entries():
    assert interpolate(TABLE, 0.5, 1e12, 1e6) == 10e-6
    assert interpolate(TABLE, 1, 1e12, 1e6) == 10e-6
    assert interpolate(TABLE, 5, 1e12, 1e6) == 30e-6


def test_interpolate_beyond_the_last_at_the_rate():
    """n 7: the last 30 us plus (7 - 5) tokens * 1e6 FLOP / 1e12 FLOP/s = 2 us -> 32 us;
    rate 2e12 halves the step: 31 us."""
    assert interpolate(TABLE, 7, 1e12, 1e6) == pytest.approx(32e-6, rel=1e-12)
    assert interpolate(TABLE, 7, 2e12, 1e6) == pytest.approx(31e-6, rel=1e-12)
    assert interpolate(TABLE, 5.5, 1e12, 4e6) == pytest.approx(32e-6, rel=1e-12)


# ---------------------------------------------------------------- link


def test_link_carries_name_bandwidth_and_latency():
    """25 GB/s, 10 us: 1 MB takes 10e-6 + 1e6 / 25e9 = 50 us."""
    link = profile_from_dict(dict(REQUIRED), F).link()
    assert (link.name, link.bandwidth_gbs, link.latency_us) == ("d", 25.0, 10.0)
    assert link.seconds(1e6) == pytest.approx(50e-6, rel=1e-12)


# ---------------------------------------------------------------- YAML text and loading


def test_profile_yaml_text_by_hand():
    p = profile_from_dict(
        with_(pinned=False, issue="async", expert_table_us={16: 7, 2: 3.5}, source='a "b"'), F
    )
    text = profile_yaml(p, "first\nsecond")
    assert text == (
        "# first\n# second\n"
        'name: "d"\n'
        "link_gbs: 25.0\n"
        "link_latency_us: 10.0\n"
        "pinned: false\n"
        "expert_launch_us: 5.0\n"
        "expert_tflops: 50.0\n"
        "tflops: 150.0\n"
        "memory_gbs: 2000.0\n"
        "step_launch_us: 2000.0\n"
        "link_issue_us: 0.0\n"
        'issue: "async"\n'
        "expert_table_us:\n"
        "  2: 3.5\n"
        "  16: 7.0\n"
        'source: "a \\"b\\""\n'
    )


def test_profile_yaml_without_comment_and_true():
    text = profile_yaml(profile_from_dict(dict(REQUIRED), F))
    assert text.startswith('name: "d"\nlink_gbs: 25.0\n')
    assert "pinned: true\n" in text and "#" not in text
    assert text.endswith('issue: "sync"\n')


def test_profile_yaml_loads_back_equal(tmp_path):
    p = profile_from_dict(with_(expert_table_us={16: 7, 2: 3.5}, expert_device_us=1.25), F)
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml(p, "c"))
    assert load_device(str(path)) == p


def test_load_device_default_is_pcie4():
    """The shipped default: PCIe 4 at 25 GB/s and 10 us, 5 us plus 50 TFLOP/s per expert,
    150 TFLOP/s, 2 TB/s and 2 ms per step; the optional fields at their defaults."""
    p = load_device()
    assert p == load_device("pcie4-default", COMMAND_LINE, "--device")
    assert p.name == "pcie4-default"
    assert (p.link_gbs, p.link_latency_us, p.pinned) == (25.0, 10.0, True)
    assert (p.expert_launch_us, p.expert_tflops) == (5.0, 50.0)
    assert (p.tflops, p.memory_gbs, p.step_launch_us) == (150.0, 2000.0, 2000.0)
    assert (p.link_issue_us, p.expert_device_us, p.issue, p.table()) == (0.0, None, "sync", None)


def test_load_device_h200_table_in_seconds():
    t = load_device("h200-pcie5-fitted").table()
    assert [k for k, _ in t] == [1, 2, 4, 8, 16]
    assert [s for _, s in t] == pytest.approx([79.011e-6, 74.966e-6, 74.602e-6, 72.536e-6,
                                               74.77e-6], rel=1e-12)  # fmt: skip


def test_load_device_unknown_name():
    with pytest.raises(InputError) as e:
        load_device("nope")
    assert (e.value.file, e.value.field) == ("<command line>", "--device")
    assert e.value.reason == (
        "unknown --device config 'nope'; known: h100-pcie5, h200-pcie5-fitted, "
        "pcie4-default (or give a file path ending in .yaml)"
    )
    with pytest.raises(InputError) as e:
        load_device("nope", "run.yaml", "device")
    assert (e.value.file, e.value.field) == ("run.yaml", "device")
    assert e.value.reason.startswith("unknown device config 'nope'; known: ")


def test_load_device_bad_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\n")
    with pytest.raises(InputError) as e:
        load_device(str(path))
    assert (e.value.file, e.value.field) == (str(path), "link_gbs")
    assert e.value.reason.startswith("missing key (required keys: name, link_gbs")


def test_load_device_reads_a_changed_file_again(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml(profile_from_dict(dict(REQUIRED), F)))
    assert load_device(str(path)).link_gbs == 25.0
    path.write_text(profile_yaml(profile_from_dict(with_(link_gbs=30.0), F)))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_device(str(path)).link_gbs == 30.0
    assert _load_stamped.cache_info().maxsize == 32


# ---------------------------------------------------------------- declarations and docs


def test_declared_units_and_choices():
    s = specs(DeviceProfile)
    units = {k: v.unit for k, v in s.items()}
    assert units == {
        "name": "",
        "link_gbs": "GB/s",
        "link_latency_us": "us",
        "pinned": "",
        "expert_launch_us": "us",
        "expert_tflops": "TFLOP/s",
        "tflops": "TFLOP/s",
        "memory_gbs": "GB/s",
        "step_launch_us": "us",
        "link_issue_us": "us",
        "expert_device_us": "us",
        "issue": "",
        "expert_table_us": "",
        "source": "",
    }
    assert s["issue"].choices == ("sync", "async")
    assert s["expert_table_us"].kind is dict and s["pinned"].kind is bool
    assert "1..64 entries" in s["expert_table_us"].doc


def test_docs_table_is_the_declared_fields():
    """docs/configs.md shows every field's type, range, unit, default and meaning as
    declared (each doc string, each unit)."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "configs.md").read_text()
    shown = docs.split("<!-- fields: DeviceProfile ", 1)[1].split("\n", 1)[1]
    assert shown.split("<!-- end fields -->", 1)[0].strip() == table(DeviceProfile)


def test_interpolate_on_a_table_of_three_entries():
    """(1, 10 us), (4, 20 us), (8, 30 us): 6 tokens lie between the last two (25 us), 8 is
    the last entry (30 us), 10 is 2 tokens beyond it at 1e6 FLOP a token and 1e12 FLOP/s:
    30 us + 2 us = 32 us."""
    table = ((1, 10e-6), (4, 20e-6), (8, 30e-6))
    assert interpolate(table, 6, 1e12, 1e6) == pytest.approx(25e-6, rel=1e-12)
    assert interpolate(table, 8, 1e12, 1e6) == pytest.approx(30e-6, rel=1e-12)
    assert interpolate(table, 10, 1e12, 1e6) == pytest.approx(32e-6, rel=1e-12)
