"""Picking an endpoint for a leg as one chain: filters narrow the candidates, scorers weigh them, a
picker takes one (chain.py). The plugins: filters.py, scorers (prefix.py), and the profiles that put
them together per role (profiles.py). Adding a scorer is a file beside prefix.py, a line in
profiles.SCORERS and its weight in a profile."""
