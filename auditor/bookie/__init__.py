"""Talking to bookies: the v3 wire protocol, a pooled asyncio client, entry availability."""
