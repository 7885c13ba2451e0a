"""Deadline Queue: storage package."""
