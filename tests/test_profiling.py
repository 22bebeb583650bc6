"""The verification steps a measured profile times (the timing itself runs in test_rank_e2e)."""

import pytest

from draftfit.profiling import verify_k_values


@pytest.mark.parametrize(
    "max_k, points, expected",
    [
        (0, None, []),
        (1, None, [1]),
        (6, None, [1, 2, 3, 4, 5, 6]),
        (6, 3, [1, 4, 6]),  # linspace(1, 6, 3) = 1, 3.5, 6 → round half to even
        (8, 3, [1, 4, 8]),  # 1, 4.5, 8
        (5, 3, [1, 3, 5]),
        (6, 2, [1, 6]),
        (6, 1, [1, 6]),  # at least the two ends
        (3, 3, [1, 2, 3]),
        (2, 5, [1, 2]),
    ],
)
def test_verify_k_values(max_k, points, expected):
    assert verify_k_values(max_k, points) == expected
