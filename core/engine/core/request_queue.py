"""The waiting queue: first-come-first-served or by priority, with O(1) lazy removal.

Aborting a waiting request marks it removed instead of searching the queue; ``peek`` and
``pop`` drop marked entries when they reach the front. So thousands of queued requests and
mass aborts (clients disconnecting) stay linear.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator

from engine.core.request import ReqId, Request


class RequestQueue(ABC):
    def __init__(self) -> None:
        self._removed: set[ReqId] = set()

    @abstractmethod
    def add(self, request: Request) -> None:
        """A new request joins the queue."""

    @abstractmethod
    def prepend(self, request: Request) -> None:
        """A preempted request goes back; it is resumed before later arrivals."""

    @abstractmethod
    def _peek_raw(self) -> Request | None: ...

    @abstractmethod
    def _pop_raw(self) -> Request: ...

    @abstractmethod
    def _num_raw(self) -> int: ...

    @abstractmethod
    def _iter_raw(self) -> Iterator[Request]: ...

    def remove(self, request: Request) -> None:
        """Mark a queued request removed (it must be in the queue)."""
        self._removed.add(request.req_id)

    def peek(self) -> Request | None:
        """The next request to schedule, or None when empty."""
        while True:
            request = self._peek_raw()
            if request is None or request.req_id not in self._removed:
                return request
            self._pop_raw()
            self._removed.discard(request.req_id)

    def pop(self) -> Request:
        request = self.peek()
        if request is None:
            raise IndexError("pop from an empty request queue")
        return self._pop_raw()

    def __len__(self) -> int:
        return self._num_raw() - len(self._removed)

    def __iter__(self) -> Iterator[Request]:
        """Queued requests (in queue order for FCFS, heap order for priority)."""
        return (r for r in self._iter_raw() if r.req_id not in self._removed)


class FCFSQueue(RequestQueue):
    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def prepend(self, request: Request) -> None:
        self._queue.appendleft(request)

    def _peek_raw(self) -> Request | None:
        return self._queue[0] if self._queue else None

    def _pop_raw(self) -> Request:
        return self._queue.popleft()

    def _num_raw(self) -> int:
        return len(self._queue)

    def _iter_raw(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue(RequestQueue):
    """Lowest ``priority`` value first (the vLLM convention), ties by arrival time."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()  # keeps equal keys in insertion order

    def add(self, request: Request) -> None:
        key = (request.priority, request.arrival_time, next(self._counter), request)
        heapq.heappush(self._heap, key)

    def prepend(self, request: Request) -> None:
        self.add(request)  # its (priority, arrival) key already places it

    def _peek_raw(self) -> Request | None:
        return self._heap[0][3] if self._heap else None

    def _pop_raw(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def _num_raw(self) -> int:
        return len(self._heap)

    def _iter_raw(self) -> Iterator[Request]:
        return (entry[3] for entry in self._heap)


def make_request_queue(policy: str) -> RequestQueue:
    if policy == "fcfs":
        return FCFSQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"--scheduling-policy must be fcfs or priority; got {policy!r}")
