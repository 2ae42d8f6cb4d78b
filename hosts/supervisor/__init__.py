"""The supervisord host (issue 7): supervisord programs as Berth lease holders.

- :mod:`.protocol`: the eventlistener protocol on a guarded standard output;
- :mod:`.rpc`: supervisord's XML-RPC (``getProcessInfo``, ``startProcess``, ``stopProcess``);
- :mod:`.plugin`: the pluggy plugin berthd loads (``berth_vouch``) and the listener acts through
  (``berth_drain``, ``berth_start``);
- :mod:`.listener`: programs mapped to leases, observe and gate modes; :mod:`.orders`: berthd's
  instructions for their leases (drain = ``stopProcess``); :mod:`.mapping`: the mapping file;
- :mod:`.cli`: ``berth supervisor listen``.

See README.md in this folder for a complete supervisord.conf and berth.toml.
"""
