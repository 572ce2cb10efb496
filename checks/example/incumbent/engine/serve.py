"""Serves requests through the registered attention target."""
import engine.attention as attention


def handle(query):
    return attention.attend(query)
