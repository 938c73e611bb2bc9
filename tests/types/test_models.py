"""The flow-control rules without a database: the token bucket and a claim's limits."""

from __future__ import annotations

from types import SimpleNamespace

from app.core.clock import MICROS
from app.types.flow import limits_for_claim
from app.types.models import SkipReason, TypeSettings

T0 = 1_800_000_000 * MICROS


def test_a_bucket_starts_full_refills_at_the_rate_and_holds_no_more_than_the_burst():
    rated = TypeSettings("email", updated_at=T0).changed(T0, {"rate_per_second": 2.0,
                                                              "burst": 4})
    assert rated.tokens_available(T0) == 4
    spent = TypeSettings("email", rate_per_second=2.0, burst=4, tokens=0.0, tokens_at=T0)
    assert spent.tokens_available(T0 + MICROS // 2) == 1.0
    assert spent.tokens_available(T0 + 60 * MICROS) == 4
    # Another host's clock behind this one refills nothing, and drains nothing either.
    assert spent.tokens_available(T0 - MICROS) == 0.0


def test_the_default_burst_is_the_rate_rounded_up_and_at_least_one():
    assert TypeSettings("email", rate_per_second=2.5).effective_burst == 3
    assert TypeSettings("email", rate_per_second=0.01).effective_burst == 1


def test_changing_the_rate_keeps_the_tokens_held_at_most_the_new_burst():
    held = TypeSettings("email", rate_per_second=1.0, burst=10, tokens=6.0, tokens_at=T0)
    assert held.changed(T0, {"burst": 3}).tokens == 3.0
    assert held.changed(T0, {"rate_per_second": 5.0}).tokens == 6.0
    assert held.changed(T0, {"rate_per_second": None}).tokens is None


def test_the_gate_blocks_paused_full_and_empty_types_and_budgets_the_others():
    settings = [TypeSettings("a", paused=True), TypeSettings("b", max_running=2),
                TypeSettings("c", max_running=5), TypeSettings("d", rate_per_second=1.0,
                                                                burst=3, tokens=0.5,
                                                                tokens_at=T0)]
    limits = limits_for_claim(settings, {("b", None): 2, ("c", "k"): 3}, T0)

    assert limits.blocked == {"a": SkipReason.PAUSED, "b": SkipReason.MAX_RUNNING,
                              "d": SkipReason.RATE}
    assert limits.budgets == {"c": 2}
    assert limits.restricts(1)


def test_a_single_claim_under_caps_with_room_runs_as_without_flow_control():
    settings = [TypeSettings("a", max_running=5, max_running_per_key=1)]
    assert not limits_for_claim(settings, {("a", "x"): 0}, T0).restricts(1)
    # Several jobs in one claim could meet one key twice; a full key must be left out.
    assert limits_for_claim(settings, {}, T0).restricts(2)
    full = limits_for_claim(settings, {("a", "x"): 1}, T0)
    assert full.restricts(1) and full.full_keys("a") == ["x"]


def test_pick_takes_candidates_in_order_within_the_budget_and_each_keys_cap():
    limits = limits_for_claim([TypeSettings("a", max_running=4, max_running_per_key=1)],
                              {("a", "x"): 1}, T0)
    rows = [SimpleNamespace(id=n, concurrency_key=key)
            for n, key in enumerate(["x", "y", "y", None, "z", "w"])]

    assert [row.id for row in limits.pick("a", rows, limit=10)] == [1, 3, 4]


def test_next_token_at_is_the_first_moment_the_gate_lets_a_claim_through():
    for rate, tokens, at in [(2.0, 0.0, T0), (3.0, 0.2, T0), (0.001, 0.0, T0 - 5 * MICROS),
                             (7.0, 0.999, T0), (1.0, 0.0, T0 + MICROS)]:  # clock behind
        spent = TypeSettings("email", rate_per_second=rate, burst=1, tokens=tokens,
                             tokens_at=at)
        when = spent.next_token_at(T0)
        assert when is not None and when > T0
        assert limits_for_claim([spent], {}, when).budgets == {"email": 1}
        assert limits_for_claim([spent], {}, when - 1).blocked == {"email": SkipReason.RATE}
    full = TypeSettings("email", rate_per_second=2.0, burst=1, tokens=1.0, tokens_at=T0)
    assert full.next_token_at(T0) is None
    assert TypeSettings("email").next_token_at(T0) is None


def test_a_workers_claim_excludes_push_types_without_counting_them_held_back():
    settings = [TypeSettings("hook", push_url="https://example.com/hook"),
                TypeSettings("pdf", paused=True)]
    worker = limits_for_claim(settings, {}, T0)
    assert worker.blocked == {"pdf": SkipReason.PAUSED}
    assert worker.excluded == {"hook"}
    assert worker.allowed({"hook", "pdf", "email"}) == {"email"}
    assert worker.restricts(1)
    assert not worker.admits([SimpleNamespace(type="hook", concurrency_key=None)])

    dispatcher = limits_for_claim(settings, {}, T0, push=True)
    assert dispatcher.blocked == {} and dispatcher.excluded == frozenset()
    assert dispatcher.allowed({"hook", "pdf", "email"}) == {"hook"}
