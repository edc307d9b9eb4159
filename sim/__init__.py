"""Performance simulator (FSE-DP, EP, Hydra): the next issue."""
