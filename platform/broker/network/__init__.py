"""The broker's sockets: the asyncio server, answers written in request order, idle timers."""
