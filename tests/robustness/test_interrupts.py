"""The Ctrl-C handler: a press raises once; a second press within REPEAT_IGNORED_SECONDS
is only recorded (it would land in the clean-up the first started), a later one raises."""

from __future__ import annotations

import signal

import pytest

from audit import interrupts


@pytest.fixture
def fresh_handler(monkeypatch):
    monkeypatch.setattr(interrupts, "_requested", False)
    monkeypatch.setattr(interrupts, "_raised_at", None)


def test_a_second_press_at_once_is_recorded_not_raised(fresh_handler):
    with pytest.raises(KeyboardInterrupt):
        interrupts._on_sigint(signal.SIGINT, None)
    interrupts._on_sigint(signal.SIGINT, None)  # the double tap: no second exception
    assert interrupts.requested()


def test_a_press_after_the_window_interrupts_again(fresh_handler, monkeypatch):
    """For a library that swallowed the first KeyboardInterrupt and went on."""
    with pytest.raises(KeyboardInterrupt):
        interrupts._on_sigint(signal.SIGINT, None)
    earlier = interrupts._raised_at - interrupts.REPEAT_IGNORED_SECONDS - 0.01
    monkeypatch.setattr(interrupts, "_raised_at", earlier)
    with pytest.raises(KeyboardInterrupt):
        interrupts._on_sigint(signal.SIGINT, None)


def test_a_press_while_held_is_recorded_and_the_next_one_raises(fresh_handler):
    """A press during a commit does not open the window: nothing was raised for it."""
    with interrupts.held():
        interrupts._on_sigint(signal.SIGINT, None)
    assert interrupts.requested()
    with pytest.raises(KeyboardInterrupt):
        interrupts._on_sigint(signal.SIGINT, None)
