"""Whether a provider counts the requests it refuses against its window: asked with one request, then known.

After a refusal the limiter's window log decides when to send again (`rcarun.budgets.limits`). A strict sliding
window counts what it accepts and nothing it refuses (the outside measurement's server of issue 17); OpenAI says
the opposite of its own limits ("unsuccessful requests contribute to your per-minute limit"). A client that keeps
refused requests in its log, as rcarun did, leaves their room unused until they leave its window too: in the
outside measurement's first minute after a refusal, the ten or so requests refused while the provider's window
was full kept the next minute 5 % under the limit. A client that drops them where the provider counts them sends
into room that is not there, and every request refused then is counted in turn: in a virtual-time run, a run of
refusals, each with its pause, and a third of the limit.

So neither is assumed: refused requests stay in the log until the provider answers the question. The first time
the log is full again with refusals in it, the oldest of them leaves the log on trial, which makes room for one
request. Whatever is sent into that room (the admissions the window would not hold with the trial counted) and
everything sent beside it is watched: where refusals count, the provider's window has no room for that one
request, so it or a request sent beside it (whose room it took) is refused, and the trial's request is counted
again for good. If nothing sent since the trial began is refused until one and a half round trips after its users
were accepted (the requests sent beside them answered too), the provider does not count refusals: every refused
request in the window leaves the log, as every later one will. Where refusals count, asking costs a refusal, once,
and the requests sent within its round trip (each refused and counted in turn: four at 0.5 s a call and 400 a
minute, in virtual time); they are the trial's, so no limit is learned from them (the window they meet holds
refusals: counting what the provider accepted would read a lower limit). A refusal that a probe above a learned
limit, or a limit changed after the request was sent, explains decides nothing, nor does a user that ends
unanswered: the trial ends undecided and the next full log asks again.

Once refusals are known not to count, a refusal the dropped room made possible (the window would be over its
limit with the dropped requests counted, and nothing above explains it) shows that they count after all, or that
the provider dates requests later than the client thinks: they are counted again, and every refusal from then on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from .limits import Grant, RateLimiter

__all__ = ["RefusalCounting"]

# How many round trips after the trial's users were accepted a refusal still answers the question: what was sent
# beside them is answered by then.
_ROUND_TRIPS_TO_DECIDE = 1.5


class RefusalCounting:
    """What one backbone knows about its provider counting refusals, and the limiter's window log kept to match.

    The gate calls `admitted` for every admission while ``watching``, `settled` for every accepted call and
    `abandoned` for every unanswered one while ``deciding``, and `refused` for every rate-limit refusal of an
    admitted request.

    Args:
        limiter: the backbone's rate limiter, whose window logs hold every admitted request.
        window_s: the provider's window (s); a refused request leaves it this long after its refusal.
        counted: what is known from the start (a preset's documented answer, or the user's); None: ask.
    """

    __slots__ = (
        "_decide_at",
        "_limiter",
        "_pending",
        "_refused_kinds",
        "_trial",
        "_trial_ended_after",
        "_trial_room",
        "_trial_started_after",
        "_trial_started_at",
        "_uncounted",
        "_users",
        "_window_s",
        "counted",
        "deciding",
        "watching",
    )

    def __init__(self, limiter: RateLimiter, window_s: float, *, counted: bool | None = None) -> None:
        self._limiter = limiter
        self._window_s = window_s
        # None: not known yet; True: the provider counts refusals; False: it does not.
        self.counted = counted
        # Whether admissions must be looked at: refusals not decided on are in the window, and no trial runs
        # or its room is not used up yet.
        self.watching = False
        # Whether answers must be looked at: a trial runs.
        self.deciding = False
        # Refused while not known, still in the log, oldest first, with when; and which limits refused them.
        self._pending: deque[tuple[float, Grant]] = deque()
        self._refused_kinds: set[str] = set()
        # The trial: its refused request, out of the log (None: no trial runs); what its room still holds for
        # users, per kind; the serials of the users not yet accepted; when its users were all accepted, plus
        # the margin (inf until then).
        self._trial: tuple[float, Grant] | None = None
        self._trial_room: dict[str, float] = {}
        self._users: set[int] = set()
        self._decide_at = math.inf
        # Where the latest trial began (the last serial admitted before it, and when) and ended (the last
        # serial admitted before it was decided; None while it runs): the refusals of what it sent, and of
        # what was sent beside it, are its cost.
        self._trial_started_after = 0
        self._trial_started_at = math.inf
        self._trial_ended_after: int | None = None
        # Refused and out of the log once known not to count, while in the window (to count again).
        self._uncounted: deque[tuple[float, Grant]] = deque()

    def admitted(self, grant: Grant, now: float) -> None:
        """An admission while `watching`: a user of the trial's room, or the full log that starts a trial."""
        self._expire_trial(now)
        if self._trial is not None:
            self._note_user(grant)
            return
        horizon = now - self._window_s
        while self._pending and self._pending[0][0] <= horizon:
            self._pending.popleft()
        if not self._pending:
            self._refused_kinds.clear()
            self.watching = False
            return
        if any(self._full_after(kind, grant) for kind in self._refused_kinds):
            self._start_trial(now, grant)

    def settled(self, grant: Grant, now: float, round_trip_s: float | None) -> None:
        """An accepted call while `deciding`: the users all accepted, and a round trip later still no refusal
        of anything sent since the trial began, refusals are known not to count."""
        self._expire_trial(now)
        users = self._users
        if grant.serial in users:
            users.discard(grant.serial)
            if not users and not self._trial_room:
                self._decide_at = now + _ROUND_TRIPS_TO_DECIDE * (round_trip_s or 0.0)
        if now >= self._decide_at:
            self._conclude(counted=False)

    def abandoned(self, grant: Grant) -> None:
        """A call ended unanswered while `deciding`: a trial it used ends undecided."""
        if grant.serial in self._users:
            self._end_trial_undecided()

    def refused(self, grant: Grant, now: float, *, requests: bool, tokens: bool, explained: bool) -> bool:
        """A refusal of ``grant`` on the named limits; ``explained``: a probe or a limit changed since it was
        sent accounts for it. True when it is the trial's (sent since a trial began, or refused since and sent
        before it was decided): the question's cost, which says nothing new about the provider's limit."""
        self._expire_trial(now)
        of_trial = self._of_trial(grant, now)
        if self.counted:
            return of_trial
        kinds = [kind for kind, refused in (("requests", requests), ("tokens", tokens)) if refused]
        if self.counted is False:
            if explained or not self._dropped_room_refused(now, kinds):
                self._limiter.uncount([grant])
                self._uncounted.append((now, grant))
            return of_trial
        if self._trial is not None and of_trial:
            if not explained:
                self._conclude(counted=True)
                return True
            self._end_trial_undecided()
        self._pending.append((now, grant))
        self._refused_kinds.update(kinds)
        self.watching = self._trial is None or bool(self._trial_room)
        return of_trial

    def _expire_trial(self, now: float) -> None:
        """A trial still running a window after it began (a user never answered, its room never used) ends
        undecided: it must not hold the question, or excuse refusals, any longer."""
        if self._trial is not None and now - self._trial_started_at > self._window_s:
            self._end_trial_undecided()
            self._trial_ended_after = None

    def _of_trial(self, grant: Grant, now: float) -> bool:
        if self._trial is None and self._trial_ended_after is None:
            return False
        if self._trial_ended_after is not None and grant.serial > self._trial_ended_after:
            return False
        return grant.serial > self._trial_started_after or now >= self._trial_started_at

    def _start_trial(self, now: float, full_after: Grant) -> None:
        trial = self._pending.popleft()
        self._trial = trial
        self._trial_room = {kind: trial[1].amount(kind) for kind in self._refused_kinds}
        self._users = set()
        self._decide_at = math.inf
        self._trial_started_after = full_after.serial
        self._trial_started_at = now
        self._trial_ended_after = None
        self.deciding = True
        self._limiter.uncount([trial[1]])

    def _note_user(self, grant: Grant) -> None:
        """An admission into the trial's room is a user. One that fits with the trial counted shows that the
        window freed more than the trial's room before it was used, which then asks nothing: undecided."""
        room = self._trial_room
        used = [kind for kind in room if self._used_trial_room(kind, grant)]
        if not used:
            self._end_trial_undecided()
            return
        self._users.add(grant.serial)
        for kind in used:
            room[kind] -= grant.amount(kind)
            if room[kind] <= 0:
                del room[kind]
        if not room:
            self.watching = False

    def _full_after(self, kind: str, admitted: Grant) -> bool:
        """Whether the window of ``kind``, as ``admitted`` left it, has no room for one more like it."""
        room = self._limiter.room_in_window(kind, after=admitted)
        amount = admitted.amount(kind)
        return room is not None and amount > 0 and amount > room

    def _used_trial_room(self, kind: str, admitted: Grant) -> bool:
        """Whether the window of ``kind``, as ``admitted`` left it, would be over its limit with the trial's
        request counted again: ``admitted`` fits only thanks to the trial's room."""
        assert self._trial is not None
        room = self._limiter.room_in_window(kind, after=admitted)
        return room is not None and room - self._trial[1].amount(kind) < 0

    def _dropped_room_refused(self, now: float, kinds: Iterable[str]) -> bool:
        """Known not to count, yet refused where the window would be over its limit with the dropped refusals
        in it: count them again, and every refusal from now on. True when it did."""
        horizon = now - self._window_s
        while self._uncounted and self._uncounted[0][0] <= horizon:
            self._uncounted.popleft()
        dropped = [grant for _, grant in self._uncounted]
        if not dropped:
            return False
        for kind in kinds:
            room = self._limiter.room_in_window(kind)
            if room is not None and sum(grant.amount(kind) for grant in dropped) > room:
                self.counted = True
                self._limiter.count_again(dropped)
                self._uncounted.clear()
                return True
        return False

    def _conclude(self, *, counted: bool) -> None:
        trial = self._trial
        assert trial is not None
        self.counted = counted
        self._close_trial()
        self.watching = False
        if counted:
            self._limiter.count_again([trial[1]])
            self._pending.clear()
            return
        self._uncounted.append(trial)
        self._uncounted.extend(self._pending)
        self._limiter.uncount([grant for _, grant in self._pending])
        self._pending.clear()

    def _end_trial_undecided(self) -> None:
        trial = self._trial
        assert trial is not None
        self._limiter.count_again([trial[1]])
        self._pending.appendleft(trial)
        self._close_trial()
        self.watching = True

    def _close_trial(self) -> None:
        self._trial, self._trial_room, self._users, self._decide_at = None, {}, set(), math.inf
        self._trial_ended_after = self._limiter.last_serial
        self.deciding = False
