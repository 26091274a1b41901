"""Neural networks: policy/value networks for the learners, population networks for evolution."""
