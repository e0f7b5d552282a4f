"""When the I/O loop progresses a one-sided plane every ``EAGER_WAIT_S`` instead of at its progress
interval (decisions C20, C25, C27): for ``EAGER_S`` after a transfer left, whatever the plane
wants; after a message left or after the plane's own activity (a WRITE posted, or a report: a
notification, a transfer released, a landing) only while the plane wants progress; never after the window.  A pass counts the
plane as active when its posts or its reports moved since the pass before."""

from __future__ import annotations

import pytest

from kvtier.shell.loop import EAGER_S, PlaneActivity, eager

NEVER = float("-inf")


@pytest.mark.parametrize(("transfer_at", "message_at", "plane_at", "wants", "expected"), [
    (NEVER, NEVER, NEVER, True, False),  # nothing happened
    (10.0, NEVER, NEVER, False, True),  # a transfer left: eager even with no progress wanted
    (NEVER, 10.0, NEVER, True, True),  # a fetch left, its load is out
    (NEVER, 10.0, NEVER, False, False),  # a refusal or a receipt left: nothing comes through the plane
    (NEVER, NEVER, 10.0, True, True),  # a notification was read, more of the load is coming
    (NEVER, NEVER, 10.0, False, False),  # the plane's last activity ended what it waited for
])
def test_the_window_opens_on_what_left_and_on_the_planes_activity(transfer_at, message_at, plane_at, wants,
                                                                    expected) -> None:
    assert eager(10.0 + EAGER_S / 2, transfer_at, message_at, plane_at, wants) is expected


@pytest.mark.parametrize("which", ["transfer", "message", "plane"])
def test_the_window_closes_eager_s_after_its_event(which: str) -> None:
    at = {"transfer": NEVER, "message": NEVER, "plane": NEVER, which: 10.0}
    assert eager(10.0 + EAGER_S * 0.99, at["transfer"], at["message"], at["plane"], True)
    assert not eager(10.0 + EAGER_S, at["transfer"], at["message"], at["plane"], True)


def test_a_pass_marks_the_plane_active_only_when_its_posts_or_reports_moved() -> None:
    now = [1.0]
    activity = PlaneActivity()
    assert activity.at == NEVER
    activity.saw(0, 0, lambda: now[0])
    assert activity.at == NEVER  # nothing posted or reported yet
    activity.saw(1, 0, lambda: now[0])  # a WRITE posted
    assert activity.at == 1.0
    now[0] = 2.0
    activity.saw(1, 0, lambda: now[0])
    assert activity.at == 1.0  # the same counts: no activity in this pass
    activity.saw(1, 3, lambda: now[0])  # notifications read
    assert activity.at == 2.0
