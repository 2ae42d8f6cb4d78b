"""Berth's ComfyUI custom node: makes ComfyUI a good neighbour of the LLMs on its card.

Source: issue 13, issue 28; seed 002 "Fronts"; reference/hosts.md "ComfyUI". Install it with
``berth comfyui install COMFYUI_DIR`` (Berth into ComfyUI's Python, this folder into
``custom_nodes/``; ``README.md`` "Install"); it needs the ``berth-gpu`` distribution in ComfyUI's
Python and imports only ``berth`` and itself, so the folder works alone. Inside Berth it is
``berth_hosts.comfyui`` (``cli.py`` and ``install.py`` are Berth's command, not the node, and
are not copied).

At import inside ComfyUI (``server.PromptServer.instance`` exists, the app is not frozen yet):

1. the gate joins ComfyUI's app as a middleware (``app.middlewares.append``: inside ComfyUI's
   own ``cache_control`` and origin checks, so a refused request is never held);
2. the Berth engine protocol routes join ComfyUI's routes;
3. the agent starts in its own thread and registers ComfyUI's process with berthd.

Outside ComfyUI (imported by Berth's tests, say) it does nothing but export the node. Any
failure is logged and leaves ComfyUI as it was: the gate passes everything.
"""

from __future__ import annotations

import logging

from .node import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "start"]

log = logging.getLogger("berth.comfyui")


def start(server=None):
    """Join ComfyUI's ``server`` (default ``PromptServer.instance``) and start the agent.
    Returns the agent, or None outside ComfyUI. Raises ``RuntimeError`` when ComfyUI's app
    is already frozen (the node was imported too late to add its gate)."""
    from . import comfy
    server = server or comfy.prompt_server()
    if server is None:
        return None                       # outside ComfyUI (berth's own CLI): import nothing more
    from . import node, routes
    from .agent import Agent
    if node.AGENT is not None:
        return node.AGENT
    if server.app.frozen:
        raise RuntimeError("ComfyUI's app is already frozen: the gate cannot be added")
    agent = Agent(server, comfy.cli_args())
    server.app.middlewares.append(agent.gate.middleware)
    routes.add_routes(server.routes, agent)
    node.AGENT = agent
    agent.start()
    log.info("Berth: the gate is on ComfyUI's app; registering pid with berthd")
    return agent


try:
    start()
except Exception:                     # never break ComfyUI's startup
    log.exception("Berth: the ComfyUI node could not start; ComfyUI runs without Berth")
