"""What the executor's tests share."""

import socket

import pytest


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to resolve a name or open a connection is recorded and refused."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network use in a test that must not touch the network")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts
