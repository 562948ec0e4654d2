"""JSON documents are indented with each list of numbers on one line, and parse to the object given."""

from __future__ import annotations

import json
import math

from nsysan.report.renderers import dump_json


def test_lists_of_numbers_are_one_line_and_the_object_round_trips():
    doc = {
        "series": list(range(1000)),
        "ratios": [0.5, 1e-9, 3.0, 12345678901234567],
        "empty": [],
        "mixed": [1, "two", None, True],
        "nested": [{"ns": [1, 2]}, (3, 4)],
        1: "an int key",
    }
    text = dump_json(doc)
    assert json.loads(text) == json.loads(json.dumps(doc))
    lines = text.splitlines()
    assert '  "series": [' + ", ".join(map(str, range(1000))) + "]," in lines
    assert '      "ns": [1, 2]' in lines
    assert "    [3, 4]" in lines
    assert '  "mixed": [' in lines  # not only numbers: one item per line, as before
    assert text.endswith("}\n")


def test_non_finite_numbers_are_written_as_python_json_writes_them():
    text = dump_json({"x": [math.nan, math.inf, 1.0]})
    assert '"x": [NaN, Infinity, 1.0]' in text
