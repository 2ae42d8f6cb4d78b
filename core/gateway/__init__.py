"""``berth gateway``: one endpoint for every engine of a machine, and of its peers.

Source: issue 14; seed 002 "Fronts" (the gateway fronts the OpenAI routes and ComfyUI's API; the
ComfyUI port fronts ComfyUI's own surface) and "Many machines" (stage D).

Modules: ``errors`` (OpenAI-shaped answers with ``src``), ``signing`` (HMAC on peer calls),
``table`` (this machine's engines, from berth.toml and berthd), ``choose`` (which machine serves
soonest), ``peers`` (other machines' gateways), ``relay`` (HTTP and websocket pass-through),
``server`` (the routes), ``comfy`` (the ComfyUI port), ``cli`` (``berth gateway``).
"""
