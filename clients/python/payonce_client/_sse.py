"""Server-sent events, read line by line as the HTML standard says a browser's EventSource does.

payonce's stream is simple (``id:`` and ``data:`` lines, ``event: end`` at the end, ``:`` comments as
keep-alives), but a proxy may re-chunk it anywhere, so frames are assembled from whole lines and only a
blank line dispatches one; a frame cut off by a closed connection is dropped, never half-read.
"""

from __future__ import annotations

from typing import List, Optional

from ._models import Event


class SSEDecoder:
    """Feed it lines (without their line break); it returns an :class:`Event` when a blank line ends one.

    ``last_event_id`` is the last ``id`` the stream gave, kept across frames as the standard says: it is
    what a reconnect sends as ``Last-Event-ID`` so that payonce sends nothing the client already has.
    """

    def __init__(self, last_event_id: Optional[str] = None):
        self.last_event_id = last_event_id
        self._event = ""
        self._data: List[str] = []
        self._id: Optional[str] = None

    def feed(self, line: str) -> Optional[Event]:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: payonce's keep-alive
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._id = value
        # `retry:` and unknown fields are ignored: reconnecting is this library's policy, not the server's
        return None

    def _dispatch(self) -> Optional[Event]:
        frame_id, event, data = self._id, self._event, self._data
        self._id, self._event, self._data = None, "", []
        if frame_id is not None:
            # Taken when the frame is complete, not when its `id:` line arrives: a connection that breaks
            # mid-frame must resume *before* that frame, or it would never be seen.
            self.last_event_id = frame_id
        if not data:  # the standard dispatches nothing for a frame without data
            return None
        return Event.from_fields(frame_id, event, "\n".join(data))
