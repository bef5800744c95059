"""Flower (flwr) apps of fedlib's methods; see fedlib.flower.rounds (no flwr: messages, server, client) and fedlib.flower.apps."""
