"""Electra's Raft engine.

`core` is a pure, I/O-free protocol state machine (modelled on etcd's raft library);
`node` is the asyncio runtime that owns sockets, disk and timers; `simulation`
drives the same core deterministically for tests.
"""
