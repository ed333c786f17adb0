"""Validation against published measurements."""
