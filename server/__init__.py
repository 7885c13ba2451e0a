"""Deadline Queue: server package."""
