"""What a failed ZMTP handshake is taken to mean (kvtier/transport/zmq_handshake.py, decisions E1, E7, E8)."""

from __future__ import annotations

import errno

import pytest

from kvtier.transport.zmq_handshake import AUTH, NO_DETAIL, handshake_problem


def test_a_hang_up_during_the_greeting_from_a_stranger_is_read_as_a_curve_listener() -> None:
    auth, text = handshake_problem(NO_DETAIL, errno.EPIPE, curve=False, dialled=True)
    assert auth and "it may require CURVE" in text and "not a kvtier listener" in text


def test_a_hang_up_from_an_address_that_spoke_without_curve_before_is_a_restart_not_auth() -> None:
    """A producer restarting on its port hangs up mid-greeting; with auth 'none' on both sides
    that was reported auth_failed, naming CURVE (an outside tester saw 3 of 476 loads fail so)."""
    auth, text = handshake_problem(NO_DETAIL, errno.EPIPE, curve=False, dialled=True, spoke=True)
    assert not auth and "restarting" in text and "CURVE (auth='curve')" not in text


@pytest.mark.parametrize("curve", [False, True])
def test_what_proves_authentication_still_does_for_an_address_that_spoke_before(curve: bool) -> None:
    auth, _ = handshake_problem(AUTH, 0, curve=curve, dialled=True, spoke=True)
    assert auth
