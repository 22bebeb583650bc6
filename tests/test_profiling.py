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


@pytest.mark.parametrize(
    "plan, levels, expected",
    [
        ((1, 8, 32), (1, 4, 8, 16, 32), (1, 8, 32)),  # the default study: the plan as it is
        ((1, 8, 32), (1, 4, 16), (1, 8, 16)),  # capped at the largest level, which is timed
        ((1, 8, 32), (1, 64), (1, 8, 32, 64)),  # never extrapolated past the largest level
        ((1, 4), (1, 4, 16), (1, 4, 16)),
        ((1, 4), (1,), (1,)),
    ],
)
def test_profile_batch_sizes_follow_the_study(plan, levels, expected):
    from draftfit.pipeline import profile_batch_sizes

    assert profile_batch_sizes(plan, levels) == expected
