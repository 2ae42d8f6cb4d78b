"""The reservation side of the node's agent: ComfyUI's budget inside its lease, and growth that
asks first.

Source: issue 13 ("Growth that asks first", dynamic VRAM); issue 28 ("withdraw what was asked",
the comfy-aimdo matrix, "a held prompt says why"); seed 000 "Growth allowance" (an extension is
a decision point where the scheduler may have to make room); ComfyUI ``main.py``
(``--reserve-vram`` is comfy-aimdo's ``simple_vram_headroom``).

Before a prompt passes the gate, the sizes on disk of the model files its loader nodes name plus
the allowance are its need; when that passes the reservation, the agent asks berthd for the
difference (``POST /v1/leases/{id}/extend``, with the need in all as ``to_bytes``: berthd's
reservation may have grown past the agent's copy from a driver read, and then only what it
lacks is asked for) and lets the prompt through once the reservation
has grown (berthd made room by its ladder first), or answers why not. A request for room lives
no longer than its prompt's wait: when the prompt gets a 503 (the wait limit, a refusal), or
its client goes away, or anything else ends the wait, the request is withdrawn
(``DELETE /v1/leases/{id}/extend``), so berthd never makes room later for a prompt that is
gone. Meanwhile the prompt's page is told why it waits (:mod:`.notice`).

With dynamic VRAM the loader's headroom is the card's total less the reservation (never less
than the user's ``--reserve-vram``), so ComfyUI's own budget stays inside its lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from berth.client import ApiError, BerthdUnavailable
from berth.decide.units import format_size

from . import comfy, notice
from .estimate import need_bytes

__all__ = ["Reservation"]

log = logging.getLogger("berth.comfyui")

_POLL_S = 0.1

#: The extension request's fields that berthd did not always take: an older berthd answers 400
#: "<field>: unknown key", and the request goes again without it.
_NEWER_FIELDS = ("to_bytes", "client_age_s", "client")


class Reservation:
    """Mixed into :class:`~.agent.Agent` (which provides the client, the gate, the lease, the
    server and ``extend_waits``, a :class:`~.notice.WaitMeter`)."""

    _headroom: comfy.Headroom | None = None

    async def _sync_reservation(self) -> bool:
        """Read the reservation back from berthd and keep dynamic VRAM's budget inside it.
        False when berthd could not be asked."""
        try:
            le = await self._client.call("GET", f"/v1/leases/{self.lease_id}")
        except (BerthdUnavailable, ApiError):
            return False
        shares = le.get("shares") or []
        if shares:
            self.card = shares[0]["card"]
            self.reserved_bytes = int(shares[0].get("reserved_bytes") or 0)
            self.size_bytes = shares[0].get("size_bytes")
            self._budget(self.reserved_bytes)
        return True

    def _budget(self, allowed_bytes: int) -> None:
        """Dynamic VRAM's simple headroom: the card's total less ``allowed_bytes``, never less
        than the user's ``--reserve-vram``; set only when it changes."""
        control = comfy.aimdo_control()
        total = comfy.card_total_bytes()
        if control is None or not total:
            return
        if self._headroom is None or self._headroom.control is not control:
            self._headroom = comfy.Headroom(control)
        want = max(comfy.reserve_vram_bytes(self.args), total - max(0, allowed_bytes))
        if want != self.headroom_bytes and self._headroom.set(want):
            self.headroom_bytes = want

    async def before_prompt(self, body: Any) -> str | None:
        """Called by the gate (ComfyUI's loop) before a prompt passes, with the body of its
        ``POST /prompt``. Returns None to let it through, or why berthd could not make room.
        Cancelled when the prompt's client goes away (the request for room is withdrawn)."""
        return await asyncio.wrap_future(self.call(self._grow(body)))

    async def _grow(self, body: Any) -> str | None:
        prompt = body.get("prompt") if isinstance(body, dict) else None
        need, files = need_bytes(prompt, comfy.resolver(), self.allowance_bytes)
        async with self._grow_lock:
            if self.size_bytes:
                need = min(need, self.size_bytes)     # the lease's size is the most it may hold
            lid = self.lease_id
            if not lid or need <= self.reserved_bytes:
                return None
            more = need - self.reserved_bytes
            log.info("Berth: this prompt names %d model file(s); it needs about %d MiB, the lease "
                     "reserves %d MiB: asking berthd for %d MiB more", len(files), need >> 20,
                     self.reserved_bytes >> 20, more >> 20)
            settled = False
            try:
                refused = await self._ask_room(lid, more, need)
                if refused is not None:
                    settled = True                # nothing was queued
                    return refused or None        # "": fail open
                why = await self._await_room(body, need, more)
                settled = why is None
                return why
            finally:
                if not settled:
                    # Never let berthd make room later for a prompt that no longer waits.
                    self._spawn(self._withdraw(lid))

    async def _ask_room(self, lid: str, more: int, need: int) -> str | None:
        """Ask berthd for ``more`` bytes, the reservation to reach ``need`` in all. None when
        asked; ``""`` to pass the prompt without (berthd down, an older berthd: fail open); else
        why berthd refused. ``more`` is reckoned from this node's copy of the reservation, which
        can be behind berthd's: a driver read of a growth (a prompt that passed while the gate
        opened) extends it there on its own. So ``to_bytes`` goes too, and berthd asks only what
        its reservation lacks (before, it made room again for what ComfyUI already held, and
        checkpointed an LLM beside it for nothing)."""
        body: dict = {"bytes": more, "to_bytes": need}
        if self.card:
            body["card"] = self.card
        # Whose prompt needs the room (issue 34: a holder that just answered it yields).
        client, age = self.gate.asker()
        if client is not None and age is not None:
            body["client"], body["client_age_s"] = client, round(age, 3)
        while True:
            try:
                await self._client.call("POST", f"/v1/leases/{lid}/extend", body)
                return None
            except BerthdUnavailable:
                return ""
            except ApiError as e:
                if e.status == 404 and "extend" not in e.message:
                    return ""                     # an older berthd: no extension requests
                # An older berthd refuses a field it does not know, by name (the node and
                # berthd can come from different installs): ask again without it, as before.
                unknown = [k for k in _NEWER_FIELDS
                           if k in body and f"{k}: unknown key" in e.message]
                if e.status != 400 or not unknown:
                    return f"berthd refused the extension: {e.message}"
                log.info("Berth: berthd does not take %s (an older berthd); asking without",
                         ", ".join(unknown))
                for k in unknown:
                    del body[k]

    async def _await_room(self, body: Any, need: int, more: int) -> str | None:
        """Wait until the reservation reaches ``need``: None, or why not within the limit."""
        start = time.monotonic()
        end = start + self.gate.wait_limit_s
        told = notice.Teller(lambda text: notice.send_text(self.server, body, text),
                             self.gate.notice_every_s)
        while time.monotonic() < end:
            if not await self._sync_reservation():
                return None                       # berthd went away: fail open
            waited = time.monotonic() - start
            if self.reserved_bytes >= need:
                self.extend_waits.record(waited)
                told.ready(waited)
                return None
            cause = f": {self.gate.cause}" if self.gate.cause else ""
            told.tell(f"berthd makes room for {format_size(more)} more for this prompt's models"
                      f"{cause}", waited, self.extend_waits.expected(waited))
            await asyncio.sleep(_POLL_S)
        return (f"berthd did not grant {format_size(more)} more within the wait limit "
                f"({self.gate.wait_limit_s:g} s)")

    async def _withdraw(self, lid: str) -> None:
        try:
            r = await self._client.call("DELETE", f"/v1/leases/{lid}/extend")
            if r.get("withdrawn"):
                log.info("Berth: the request for more room was withdrawn (its prompt no longer "
                         "waits)")
        except (BerthdUnavailable, ApiError) as e:
            log.info("Berth: the request for more room could not be withdrawn: %s", e)
