"""RCTA, Root-Cause Trajectory Attribution (LongRCA paper, Sec. 4; App. H, L.3): the method and its parts.

Each deterministic part is its own module, tested alone; `method` wires the stages (docs/methods/rcta.md).
"""
