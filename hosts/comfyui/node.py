"""The "Berth status" node: what Berth knows of this ComfyUI, as a string output.

Source: issue 13 ("a small 'Berth status' node"); ComfyUI's V1 node API (``INPUT_TYPES``,
``RETURN_TYPES``, ``FUNCTION``, ``CATEGORY``, ``OUTPUT_NODE``), which every release since the
first loads through ``NODE_CLASS_MAPPINGS``.
"""

from __future__ import annotations

import json

__all__ = ["BerthStatus", "NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]

#: Set by the package's ``__init__`` when it runs inside ComfyUI.
AGENT = None


class BerthStatus:
    """Outputs the lease, the gate's state and counters, and the node's health as JSON text."""

    CATEGORY = "utils/berth"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("status",)
    FUNCTION = "status"
    OUTPUT_NODE = True
    DESCRIPTION = "Berth's view of this ComfyUI: its lease with berthd, the gate, the health."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    @classmethod
    def IS_CHANGED(cls, **_kw):
        return float("nan")          # never cached: the status changes on its own

    def status(self, **_kw):
        st = AGENT.status() if AGENT is not None else {"health": "not running inside ComfyUI"}
        text = json.dumps(st, sort_keys=True)
        return {"ui": {"text": [text]}, "result": (text,)}


NODE_CLASS_MAPPINGS = {"BerthStatus": BerthStatus}
NODE_DISPLAY_NAME_MAPPINGS = {"BerthStatus": "Berth status"}
