"""``berth gateway``: one endpoint for every engine of a machine, and of its peers.

Source: issue 14; issue 27; seed 002 "Fronts" (the gateway fronts the OpenAI routes and ComfyUI's
API; the ComfyUI port fronts ComfyUI's own surface) and "Many machines" (stage D).

Modules: ``server`` (the routes and the lifetime), ``route`` (the OpenAI routes: tries by
rank, what a client is told when none answers), ``fast`` (the task-free way), ``relay`` (one try
on the front's HTTP code, its limits), ``body`` (request bodies: kept or spooled, the model
found), ``choose`` (the ranking by expected time to first byte), ``table`` (this machine's
engines, from berth.toml and berthd), ``peers`` (other machines' gateways), ``signing`` (HMAC
on peer calls), ``views`` (``/v1/models``, status, health, metrics), ``errors`` (answers in
OpenAI's shape with ``src``), ``ws`` (the board and websockets, handed to aiohttp), ``comfy``
(the ComfyUI port), ``cli`` (``berth gateway``).
"""
