"""Bridges: the doors out of a sandbox, all on one server, every call proved.

- :mod:`lnk.bridges.proof`: the endpoint proof and the bridge proof (HMAC-SHA256).
- :mod:`lnk.bridges.server`: :class:`BridgeServer`, the one server every bridge runs on.
- :mod:`lnk.bridges.client`: :func:`call`, one proved call to a bridge.

See ``docs/bridges.md`` for the protocol.

(Nothing is imported here: the harness and the runner take the proof alone, without
the server's asyncio, as each agent start waits on both.)
"""
