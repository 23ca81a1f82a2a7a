"""The dealer's orthogonal masks: random ones never have a small block, and a party refuses masks that hide too
little under its policy (min_mask_block, min_mask_mixing), whoever dealt them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import block_diag, expm

from vflo.errors import ConfigError, ProtocolError
from vflo.methods.masks import OrthogonalMask, random_orthogonal, required_mixing
from vflo.party.policy import Policy

NO_BLOCKS = np.zeros((0, 0, 0))
NO_TAIL = np.zeros((0, 0))


def dense(M: np.ndarray) -> OrthogonalMask:
    return OrthogonalMask(NO_BLOCKS, M)


def stacked(blocks: list[np.ndarray], tail: np.ndarray = NO_TAIL) -> OrthogonalMask:
    return OrthogonalMask(np.stack(blocks), tail)


def haar(n: int, seed: int = 0) -> np.ndarray:
    return random_orthogonal(n, np.random.default_rng(seed))


def signed_permutation(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.eye(n)[rng.permutation(n)] * rng.choice([-1.0, 1.0], size=n)


# --- what an honest dealer deals -------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "block", "min_block"), [
    (1, None, 64), (2, None, 64), (3, None, 64), (7, None, 64), (15, None, 64), (16, None, 64), (40, None, 64),
    (63, None, 64), (150, None, 64), (400, None, 64),
    (64, 16, 16), (65, 16, 16), (97, 16, 16), (33, 16, 16), (17, 16, 16), (100, 7, 7), (201, 20, 20),
    (50, 64, 64), (129, 64, 64), (300, 64, 64), (5, 2, 2),
])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_masks_the_dealer_makes_pass_at_many_sizes(n: int, block: int | None, min_block: int, dtype: str) -> None:
    for seed in range(8):
        mask = OrthogonalMask.random(n, block, np.random.default_rng(seed), dtype)
        mask.check_strength("test", min_block=min_block, min_mixing=8.0)


def test_dense_masks_of_every_small_size_pass_under_the_default_policy() -> None:
    policy = Policy()
    rng = np.random.default_rng(7)
    for n in range(1, 70):
        for _ in range(5):
            OrthogonalMask.random(n, None, rng).check_strength(
                "test", min_block=policy.min_mask_block, min_mixing=policy.min_mask_mixing)


def test_a_large_min_mixing_is_capped_at_what_a_random_block_of_that_size_reaches() -> None:
    assert required_mixing(100, 1000.0) == pytest.approx(5.0)
    assert required_mixing(400, 8.0) == 8.0
    assert 1.0 < required_mixing(2, 8.0) < required_mixing(5, 8.0) < required_mixing(20, 8.0) < 2.0
    assert required_mixing(1, 8.0) == 1.0 and required_mixing(50, 1.0) == 1.0
    rng = np.random.default_rng(3)
    for n in (2, 5, 12, 40, 120):
        OrthogonalMask.random(n, None, rng).check_strength("test", min_block=2, min_mixing=1e9)


def test_the_single_argument_call_still_checks_with_the_weakest_block_bound() -> None:
    OrthogonalMask.random(100, 16, np.random.default_rng(0)).check_strength("test")
    with pytest.raises(ProtocolError, match="refused"):
        dense(np.eye(30)).check_strength("test")


def test_random_never_makes_a_block_smaller_than_block_size() -> None:
    rng = np.random.default_rng(0)
    for n in range(1, 60):
        for block in range(1, 22):
            mask = OrthogonalMask.random(n, block, rng)
            assert mask.size == n
            sizes = [mask.blocks.shape[1]] * mask.blocks.shape[0] + ([mask.tail.shape[0]] if mask.tail.size else [])
            assert all(size >= min(block, n) for size in sizes), (n, block, sizes)
            assert sum(sizes) == n
            if mask.blocks.shape[0]:  # blocked: full blocks, and a last one of block .. 2 block - 1 rows
                assert (mask.blocks.shape[1] == block and block <= mask.tail.shape[0] < 2 * block) or \
                    (n % block == 0 and mask.tail.shape[0] == 0)
    one = OrthogonalMask.random(33, 16, rng)  # n mod b == 1: 16 + 17, never a 1 x 1 tail
    assert one.blocks.shape == (1, 16, 16) and one.tail.shape == (17, 17)


@pytest.mark.parametrize(("n", "block"), [(1, None), (9, None), (40, 16), (33, 16), (48, 16), (20, 30), (12, 1)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_left_left_t_right_and_dense_are_the_dense_products(n: int, block: int | None, dtype: str) -> None:
    rng = np.random.default_rng(n)
    mask = OrthogonalMask.random(n, block, rng, dtype)
    M = mask.dense()
    tol = 1e-10 if dtype == "float64" else 1e-5
    assert np.allclose(M @ M.T, np.eye(n), atol=tol)
    X = rng.normal(size=(n, 3)).astype(dtype)
    assert np.allclose(mask.left(X), M @ X, atol=tol) and np.allclose(mask.left_t(X), M.T @ X, atol=tol)
    assert np.allclose(mask.right(X.T), X.T @ M, atol=tol)
    v = rng.normal(size=n).astype(dtype)
    assert np.allclose(mask.left(v), M @ v, atol=tol) and np.allclose(mask.left_t(mask.left(v)), v, atol=tol)
    back = OrthogonalMask.from_payload(mask.to_payload("p"), "p")
    assert np.array_equal(back.dense(), M)


# --- what a dishonest dealer might deal ------------------------------------------------------------------------


def _half_identity(n: int) -> np.ndarray:
    """The first half of the rows unit vectors (passed in the clear), the rest a random rotation of the rest."""
    return block_diag(np.eye(n // 2), haar(n - n // 2, seed=1))


def _near_identity(n: int, angle: float) -> np.ndarray:
    S = np.random.default_rng(2).normal(size=(n, n))
    return np.asarray(expm(angle * (S - S.T) / math.sqrt(2 * n)))


SMALL_BLOCKS = "smaller than this party's policy allows .*min_mask_block = 16"
UNMIXED = r"hides too little: .* mixes only .* below the .* \(min_mask_mixing = 8\.0"
IN_CLEAR = "passes an input nearly in the clear .*above 0.95"

REFUSED = {
    "identity as 1x1 blocks": (OrthogonalMask(np.ones((40, 1, 1)), NO_TAIL), 16, "block 1 of 40, of size 1, is " +
                               SMALL_BLOCKS),
    "identity, one dense block": (dense(np.eye(40)), 16, "block 1 of 1, of size 40, " + IN_CLEAR),
    "small identity, one dense block": (dense(np.eye(10)), 16, "size 10, " + UNMIXED),
    "identity of 2 rows": (dense(np.eye(2)), 16, UNMIXED),
    "signed permutation, dense": (dense(signed_permutation(30)), 16, IN_CLEAR),
    "small signed permutation, dense": (dense(signed_permutation(9)), 16, UNMIXED),
    "permutations in 7x7 blocks": (stacked([signed_permutation(7, s) for s in range(10)]), 16, SMALL_BLOCKS),
    "permutations in 7x7 blocks, 7 allowed": (stacked([signed_permutation(7, s) for s in range(10)]), 7,
                                              "block 1 of 10, of size 7, hides too little"),
    "10x10 random blocks inside a 100x100 block": (dense(block_diag(*[haar(10, s) for s in range(10)])), 16,
                                                   UNMIXED),
    "permutations inside a big block": (dense(block_diag(*[signed_permutation(5, s) for s in range(8)])), 16,
                                        IN_CLEAR),
    "half identity": (dense(_half_identity(40)), 16, IN_CLEAR),
    "small half identity": (dense(_half_identity(12)), 16, UNMIXED),
    "rotation near identity": (dense(_near_identity(40, 0.1)), 16, IN_CLEAR),
    "small rotation near identity": (dense(_near_identity(10, 0.03)), 16, UNMIXED),
    "rotation near a permutation, entries under 0.95": (dense(_near_identity(64, 0.5)), 16, UNMIXED),
    "1x1 tail": (stacked([haar(16, s) for s in range(3)], np.ones((1, 1))), 16, "block 4 of 4, of size 1, is " +
                 SMALL_BLOCKS),
    "a small tail": (stacked([haar(16, s) for s in range(3)], haar(5)), 16, "block 4 of 4, of size 5, is"),
    "not orthogonal": (dense(np.ones((20, 20))), 16, "is not orthogonal"),
    "scaled": (dense(0.9 * haar(20)), 16, "is not orthogonal"),
    "one column scaled": (stacked([haar(20), haar(20, 1) * np.r_[np.ones(19), 0.5]]), 16,
                          "block 2 of 2, of size 20, is not orthogonal"),
    "not finite": (dense(np.full((20, 20), np.nan)), 16, "is not orthogonal"),
    "too large": (dense(np.full((20, 20), 1e300)), 16, "is not orthogonal"),
    "complex": (dense(haar(20).astype(complex)), 16, "is not a real matrix"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_masks_that_hide_too_little_are_refused_naming_the_problem(case: str) -> None:
    mask, min_block, message = REFUSED[case]
    with pytest.raises(ProtocolError, match=message) as info:
        mask.check_strength("party 'b': the row mask from 'dealer'", min_block=min_block, min_mixing=8.0)
    text = str(info.value)
    assert text.startswith("party 'b': the row mask from 'dealer': mask block ") and text.endswith("; refused")


def test_the_mixing_check_can_be_turned_off_but_not_the_block_size() -> None:
    dense(np.eye(10)).check_strength("test", min_block=2, min_mixing=1.0)
    with pytest.raises(ProtocolError, match="nearly in the clear"):
        dense(np.eye(20)).check_strength("test", min_block=2, min_mixing=1.0)
    with pytest.raises(ProtocolError, match="min_mask_block = 64"):
        OrthogonalMask.random(200, 32, np.random.default_rng(0)).check_strength("test", min_block=64,
                                                                               min_mixing=1.0)


def test_a_near_permutation_is_caught_where_a_random_block_of_its_size_never_goes() -> None:
    """A random 64 x 64 block's rows mix about 22 inputs; a rotation a little away from the identity, none of
    whose entries reaches 0.95, still leaves rows mixing only a handful, below min(8, 0.05 * 64 = 3.2)."""
    M = _near_identity(64, 0.5)
    assert np.abs(M).max() < 0.95
    PR = 1 / (M**4).sum(axis=1)
    assert PR.min() < required_mixing(64, 8.0) < 8.0
    haar_pr = [(1 / (haar(64, s) ** 4).sum(axis=1)).min() for s in range(20)]
    assert min(haar_pr) > 2 * required_mixing(64, 8.0)


# --- the policy that sets the bounds ---------------------------------------------------------------------------


def test_the_policy_holds_the_mask_bounds_with_their_defaults() -> None:
    assert (Policy().min_mask_block, Policy().min_mask_mixing) == (64, 8.0)
    policy = Policy(min_mask_block=128, min_mask_mixing=20.0)
    assert (policy.min_mask_block, policy.min_mask_mixing) == (128, 20.0)
    assert Policy(min_mask_block=2, min_mask_mixing=1).open


@pytest.mark.parametrize(("field", "value"), [
    ("min_mask_block", 1), ("min_mask_block", 0), ("min_mask_block", True), ("min_mask_block", 8.0),
    ("min_mask_mixing", 0.5), ("min_mask_mixing", float("nan")), ("min_mask_mixing", float("inf")),
    ("min_mask_mixing", True), ("min_mask_mixing", "8"),
])
def test_mask_bounds_outside_their_range_are_refused_naming_the_field_and_the_fix(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"policy\.{field} must be .* set {field} = .* under \[policy\]"):
        Policy(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("rule", "message"), [
    ({"min": True}, "min must be a finite number, got True"),
    ({"max": float("nan")}, "max must be a finite number, got nan"),
    ({"min": float("-inf")}, "min must be a finite number"),
    ({"max": "10"}, "max must be a finite number, got '10'"),
    ({"min": 5, "max": 1}, "min = 5 is above max = 1"),
])
def test_bound_tables_must_hold_finite_numbers_in_order(rule: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"policy\.require\.rap\.max_condition: {message}"):
        Policy(require={"rap.max_condition": rule})


def test_sound_bound_tables_are_kept() -> None:
    for rule in ({"min": 1, "max": 5}, {"min": 3.0, "max": 3}, {"max": 10.0}, {"min": -2}):
        assert Policy(require={"rap.max_condition": rule}).require["rap.max_condition"] == rule
