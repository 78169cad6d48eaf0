"""fedseg.wording.listed: the one way messages list names."""

import pytest

from fedseg.wording import listed


@pytest.mark.parametrize(
    ("words", "shown", "expected"),
    [
        ([], None, ""),
        (["a"], None, "a"),
        (["a", "b"], None, "a and b"),
        (["a", "b", "c"], None, "a, b and c"),
        (["a", "b", "c"], 2, "a, b and c"),  # one word left over is named, not counted
        (["a", "b", "c", "d"], 2, "a, b and 2 more"),
        (["a", "b", "c", "d", "e", "f"], 3, "a, b, c and 3 more"),
        (iter(["x", "y"]), 1, "x and y"),
    ],
)
def test_listed(words, shown, expected):
    assert listed(words, shown) == expected
