"""Property tests: ``nsysan report --set KIND.PARAM=VALUE`` parsing (:func:`nsysan.detect.parse_settings`).

The grammar: ``KIND.PARAM=VALUE``, KIND a registered detector, PARAM one of its parameters' dataclass
fields, VALUE a finite number >= 0 as Python's float() reads it, converted to the type of the
parameter's default; later items override earlier ones. Anything else is an InputError (exit 2, one
line), never another exception (exit 70, "internal error").
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nsysan.detect import parse_settings, registered
from nsysan.errors import InputError

SPECS = registered()
FIELDS = {kind: {f.name: f for f in dataclasses.fields(spec.params)} for kind, spec in SPECS.items()}
PARAMS = sorted((kind, name) for kind, fields in FIELDS.items() for name in fields)
INT_PARAMS = [(k, n) for k, n in PARAMS if type(FIELDS[k][n].default) is int]
FLOAT_PARAMS = [(k, n) for k, n in PARAMS if type(FIELDS[k][n].default) is float]

SPACE = st.sampled_from(["", " ", "\t", "  "])


def test_the_registry_is_what_these_tests_assume():
    assert set(SPECS) >= {"nccl_ordering_stall", "graph_allreduce_gap", "comm_compute_slowdown", "command_buffer_full"}
    assert INT_PARAMS and FLOAT_PARAMS and len(INT_PARAMS) + len(FLOAT_PARAMS) == len(PARAMS)


@st.composite
def valid_setting(draw: st.DrawFn) -> tuple[str, str, str, float | int]:
    """(kind, param, how the user wrote it, the value it means)."""
    kind, name = draw(st.sampled_from(PARAMS))
    if type(FIELDS[kind][name].default) is int:
        m, k = draw(st.integers(0, 10**6)), draw(st.integers(0, 9))
        value: float | int = m * 10**k
        text = draw(st.sampled_from([str(value), f"{value}.0", f"{m}e{k}", f"{m}E+{k}", f"{m}.000e{k}"]))
    else:
        value = draw(st.floats(0, 1e300, allow_nan=False, allow_infinity=False))
        text = draw(st.sampled_from([repr(value), f"{value:e}" if value == float(f"{value:e}") else repr(value)]))
    key = f"{draw(SPACE)}{kind}.{name}{draw(SPACE)}"
    return kind, name, f"{key}={draw(SPACE)}{text}{draw(SPACE)}", value


@settings(max_examples=300, deadline=None)
@given(st.lists(valid_setting(), max_size=8))
def test_valid_settings_round_trip(items):
    """What comes out is what was written, typed like the default, the last one winning; and every
    setting builds the detector's parameters."""
    expected: dict[str, dict[str, float | int]] = {}
    for kind, name, _, value in items:
        expected.setdefault(kind, {})[name] = value
    got = parse_settings([text for _, _, text, _ in items])
    assert got == expected
    for kind, values in got.items():
        for name, value in values.items():
            assert type(value) is type(FIELDS[kind][name].default)
        params = SPECS[kind].params(**values)
        assert all(getattr(params, k) == v for k, v in values.items())


def test_printing_a_parsed_setting_and_parsing_it_again_gives_the_same():
    once = parse_settings(["comm_compute_slowdown.min_ratio=1.3", "command_buffer_full.min_blocked_ns=2e5"])
    again = parse_settings([f"{k}.{p}={v!r}" for k, ps in once.items() for p, v in ps.items()])
    expected = {"comm_compute_slowdown": {"min_ratio": 1.3}, "command_buffer_full": {"min_blocked_ns": 200_000}}
    assert once == again == expected


NOT_NUMBERS = ["", " ", "nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1", "-1e-9", "0x10", "1,5",
               "one", "1.2.3", "--1", "1e", "½", "\x00", "1_0_", "True"]  # fmt: skip
BAD_NUMBERS = st.one_of(
    st.sampled_from(NOT_NUMBERS),
    st.floats(max_value=-1e-300).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Nd",)), min_size=1, max_size=6),
)


@st.composite
def invalid_setting(draw: st.DrawFn) -> str:
    kind, name = draw(st.sampled_from(PARAMS))
    how = draw(st.sampled_from(["no =", "no .", "unknown kind", "unknown param", "bad number", "empty"]))
    if how == "no =":
        return f"{kind}.{name}{draw(st.sampled_from(['', ':1', ' 1']))}"
    if how == "no .":
        return f"{kind}{draw(st.sampled_from(['', '_', ':', '/']))}{name}=1"
    if how == "unknown kind":
        other = draw(st.text(min_size=0, max_size=12).filter(lambda s: s.strip() not in SPECS and "=" not in s))
        return f"{other}.{name}=1"
    if how == "unknown param":
        other = draw(st.text(min_size=0, max_size=12).filter(lambda s: s.strip() not in FIELDS[kind] and "=" not in s))
        return f"{kind}.{other}=1"
    if how == "bad number":
        value = draw(BAD_NUMBERS)
        try:
            number = float(value)
            assume(not (math.isfinite(number) and number >= 0))
        except ValueError:
            pass
        return f"{kind}.{name}={value}"
    return ""


@settings(max_examples=500, deadline=None)
@given(st.lists(valid_setting().map(lambda v: v[2]), max_size=3), invalid_setting(), st.randoms(use_true_random=False))
def test_invalid_settings_are_input_errors_naming_the_item(valid, bad, rnd):
    items = [*valid]
    items.insert(rnd.randrange(len(items) + 1), bad)
    with pytest.raises(InputError) as error:
        parse_settings(items)
    assert repr(bad) in str(error.value)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=40) | st.builds(lambda k, s, v: f"{k}{s}{v}", st.sampled_from([f"{k}.{n}" for k, n in PARAMS]),
                                        st.sampled_from(["=", "= ", "=\t"]), st.text(max_size=12)))  # fmt: skip
def test_any_text_is_a_setting_or_an_input_error_never_a_crash(text):
    try:
        got = parse_settings([text])
    except InputError:
        return
    ((kind, values),) = got.items()
    ((name, value),) = values.items()
    assert name in FIELDS[kind] and math.isfinite(value) and value >= 0


@pytest.mark.parametrize("value", ["2.7", "0.5", "1e-3", "15000.25"])
def test_a_fraction_for_an_integer_parameter_is_refused(value):
    accepted = {}
    for kind, name in INT_PARAMS:
        with contextlib.suppress(InputError):
            accepted[f"{kind}.{name}"] = parse_settings([f"{kind}.{name}={value}"])[kind][name]
    assert accepted == {}
