"""Deadline Queue: client package."""
