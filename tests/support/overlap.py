"""Intervals that overlap: how many were open at one moment (a limit that held, and was reached)."""


def most_at_once(intervals) -> int:
    """The most intervals (start, end) open at one moment."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in events:  # an end sorts before a start at the same moment (-1 < 1): touching is not overlap
        now += step
        most = max(most, now)
    return most
