"""The paper's protected window: the most recent 128 tokens are always kept, and a token is judged when it leaves
them. Every default window (the presses, calibration, the registry, the tables) reads it from here."""

WINDOW = 128
