"""Fault tests: rcarun against a hostile OpenAI-compatible server of its own, with the server's log as ground truth."""
