"""onebox: fast deep RL and neuroevolution on one machine."""

__version__ = "0.1.0"
