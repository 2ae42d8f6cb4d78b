"""The reservation side of the node's agent: ComfyUI's budget inside its lease, and growth that
asks first.

Source: issue 13 ("Growth that asks first", dynamic VRAM); seed 000 "Growth allowance" (an
extension is a decision point where the scheduler may have to make room); Comfy-Org/ComfyUI
#14396 and PR #14480 (``--vram-headroom``; comfy-aimdo's ``simple_vram_headroom``).

Before a prompt passes the gate, the sizes on disk of the model files its loader nodes name plus
the allowance are its need; when that passes the reservation, the agent asks berthd for the
difference (``POST /v1/leases/{id}/extend``) and lets the prompt through once the reservation
has grown (berthd made room by its ladder first), or answers why not. With dynamic VRAM the
loader's headroom is the card's total less the reservation, so ComfyUI's own budget stays inside
its lease.
"""

from __future__ import annotations

import asyncio
import logging
import time

from berth.client import ApiError, BerthdUnavailable

from . import comfy
from .estimate import need_bytes

__all__ = ["Reservation"]

log = logging.getLogger("berth.comfyui")


class Reservation:
    """Mixed into :class:`~.agent.Agent` (which provides the client, the gate, the lease)."""

    async def _sync_reservation(self) -> None:
        """Read the reservation back from berthd and keep dynamic VRAM's budget inside it."""
        try:
            le = await self._client.call("GET", f"/v1/leases/{self.lease_id}")
        except (BerthdUnavailable, ApiError):
            return
        shares = le.get("shares") or []
        if shares:
            self.card = shares[0]["card"]
            self.reserved_bytes = int(shares[0].get("reserved_bytes") or 0)
            self.size_bytes = shares[0].get("size_bytes")
            self._budget(self.reserved_bytes)

    def _budget(self, allowed_bytes: int) -> None:
        control = comfy.aimdo_control()
        total = comfy.card_total_bytes()
        if control is None or not total:
            return
        if comfy.set_headroom(control, total - max(0, allowed_bytes)):
            self.headroom_bytes = total - max(0, allowed_bytes)

    async def before_prompt(self, prompt: object) -> str | None:
        """Called by the gate (ComfyUI's loop) before a prompt passes. Returns None to let it
        through, or why berthd could not make room."""
        return await asyncio.wrap_future(self.call(self._grow(prompt)))

    async def _grow(self, prompt: object) -> str | None:
        need, files = need_bytes(prompt, comfy.resolver(), self.allowance_bytes)
        async with self._grow_lock:
            if self.size_bytes:
                need = min(need, self.size_bytes)     # the lease's size is the most it may hold
            if not self.lease_id or need <= self.reserved_bytes:
                return None
            more = need - self.reserved_bytes
            log.info("Berth: this prompt names %d model file(s); it needs about %d MiB, the lease "
                     "reserves %d MiB: asking berthd for %d MiB more", len(files), need >> 20,
                     self.reserved_bytes >> 20, more >> 20)
            body = {"bytes": more}
            if self.card:
                body["card"] = self.card
            try:
                await self._client.call("POST", f"/v1/leases/{self.lease_id}/extend", body)
            except BerthdUnavailable:
                return None                       # fail open
            except ApiError as e:
                if e.status == 404 and "extend" not in e.message:
                    return None                   # an older berthd: no extension requests
                return f"berthd refused the extension: {e.message}"
            end = time.monotonic() + self.gate.wait_limit_s
            while time.monotonic() < end:
                await self._sync_reservation()
                if self.reserved_bytes >= need:
                    return None
                await asyncio.sleep(0.1)
            return (f"berthd did not grant {more >> 20} MiB more within the wait limit "
                    f"({self.gate.wait_limit_s:g} s)")

