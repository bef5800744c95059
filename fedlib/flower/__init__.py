"""Flower (flwr) apps of fedlib's methods; see fedlib.flower.rounds (no flwr) and fedlib.flower.apps."""
