"""A paid-provider simulator served as its own process: charges, keys, failure injection, ledger.

`python -m sandbox` runs a supervisor that keeps `python -m sandbox.server` alive (so an injected
crash comes back with its ledger); the server itself is pure standard library and never imports Django.
"""
