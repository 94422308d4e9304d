"""RCTA, Root-Cause Trajectory Attribution (LongRCA paper, Sec. 4; App. H, L.3): the method and its parts.

Each deterministic part is a module of its own so that it can be tested alone: role classes (`roles`),
segmentation and step enrichment, candidate pooling, handoff evidence (A2), linkage hints, quote grounding
and validation (A4). The LLM stages are wired together by the method module.
"""
