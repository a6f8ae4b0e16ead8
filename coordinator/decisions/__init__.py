"""The coordinator's decisions: pure state machines that take events and return commands; no Ray, no
torch."""
